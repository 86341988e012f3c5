# turnkeep's public names, listed once: type checkers read these imports, and the package's
# `__getattr__` imports each name from its module on first use (turnkeep.support.lazy). They
# are what an application runs turns with, and what it extends turnkeep with: model providers
# (ModelProvider), kinds of tool server (ToolSource), hooks and approval policies.
from turnkeep.activities.hooks import Hook as Hook
from turnkeep.client.children import ChildEnded as ChildEnded
from turnkeep.client.children import ChildStarted as ChildStarted
from turnkeep.client.children import ChildText as ChildText
from turnkeep.client.children import ChildTurn as ChildTurn
from turnkeep.client.connection import connect as connect
from turnkeep.client.forks import ForkError as ForkError
from turnkeep.client.live import MessageEvent as MessageEvent
from turnkeep.client.live import Restarted as Restarted
from turnkeep.client.live import StreamEvent as StreamEvent
from turnkeep.client.live import TextDelta as TextDelta
from turnkeep.client.live import ToolCallStart as ToolCallStart
from turnkeep.client.plugin import TurnkeepClientPlugin as TurnkeepClientPlugin
from turnkeep.client.sessions import SessionHandle as SessionHandle
from turnkeep.client.sessions import get_session as get_session
from turnkeep.client.sessions import open_session as open_session
from turnkeep.client.turns import TurnHandle as TurnHandle
from turnkeep.client.turns import get_turn as get_turn
from turnkeep.client.turns import start_turn as start_turn
from turnkeep.config.agents import Agent as Agent
from turnkeep.config.agents import Approval as Approval
from turnkeep.config.agents import ClientTool as ClientTool
from turnkeep.config.agents import McpServer as McpServer
from turnkeep.config.files import load_settings as load_settings
from turnkeep.config.settings import Settings as Settings
from turnkeep.contract.activity_io import HookChange as HookChange
from turnkeep.contract.activity_io import HookContext as HookContext
from turnkeep.contract.activity_io import HookPoint as HookPoint
from turnkeep.contract.approval import ApprovalPolicy as ApprovalPolicy
from turnkeep.contract.approval import ApprovalRequest as ApprovalRequest
from turnkeep.contract.approval import PolicyDecision as PolicyDecision
from turnkeep.contract.messages import Message as Message
from turnkeep.contract.messages import StopReason as StopReason
from turnkeep.contract.turn_io import TurnCancelledError as TurnCancelledError
from turnkeep.contract.turn_io import TurnInput as TurnInput
from turnkeep.contract.turn_io import TurnResult as TurnResult
from turnkeep.contract.turn_io import agent_task_queue as agent_task_queue
from turnkeep.fastagent.request_params import RequestParams as RequestParams
from turnkeep.providers.base import ModelProvider as ModelProvider
from turnkeep.tools.source import ToolSource as ToolSource
from turnkeep.worker.build import build_worker as build_worker
from turnkeep.worker.build import build_workers as build_workers
from turnkeep.worker.plugin import TurnkeepPlugin as TurnkeepPlugin
