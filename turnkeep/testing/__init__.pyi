# turnkeep.testing's names, listed once: type checkers read these imports, and the package's
# `__getattr__` imports each name from its module on first use (turnkeep.support.lazy).
from turnkeep.providers.passthrough import CALL_TOOL as CALL_TOOL
from turnkeep.providers.passthrough import FIXED_RESPONSE as FIXED_RESPONSE
from turnkeep.providers.passthrough import PassthroughProvider as PassthroughProvider
from turnkeep.providers.playback import PlaybackProvider as PlaybackProvider
from turnkeep.testing.environment import Harness as Harness
from turnkeep.testing.environment import TurnkeepEnvironment as TurnkeepEnvironment
from turnkeep.testing.environment import eventually as eventually
from turnkeep.testing.environment import harness as harness
from turnkeep.testing.evaluations import EvaluationFailedError as EvaluationFailedError
from turnkeep.testing.evaluations import assert_replays as assert_replays
from turnkeep.testing.fake_api import FakeModelApi as FakeModelApi
from turnkeep.testing.fake_api import Recorded as Recorded
from turnkeep.testing.fake_api import Reply as Reply
from turnkeep.testing.fake_api import Tokens as Tokens
from turnkeep.testing.fake_model import FakeModel as FakeModel
from turnkeep.testing.replay import ReplayFailedError as ReplayFailedError
from turnkeep.testing.replay import check_replay as check_replay
