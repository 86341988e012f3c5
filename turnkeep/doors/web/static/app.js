// turnkeep's chat and approvals page: a plain ES module over the gateway's /api, no build step.
//
// The API key is asked once and kept in localStorage; the chat's session id is kept in the
// address (#session=...), so a reload, or the address opened elsewhere, resumes the chat from
// its transcript. Events are read with fetch() and a small server-sent events parser, because
// EventSource cannot send the Authorization header.

const KEY_STORAGE = "turnkeep.apiKey";
const RETRY_MIN_MS = 500;
const RETRY_MAX_MS = 5000;

const $ = (id) => document.getElementById(id);

const state = {
  key: localStorage.getItem(KEY_STORAGE) || "",
  agents: [],
  session: null, // {id, agent, open}
  lastIndex: -1, // the index of the last message shown: the stream resumes after it
  stream: null, // the AbortController of the session's event stream
  webUi: new Map(), // turn id -> its Temporal Web UI address, when the API gave one
  toolNames: new Map(), // call id -> tool name, to title the results
  approvals: new Map(), // turn id -> calls waiting in it (or in its child turns)
  lastTurnId: null,
  pendingUser: null, // the message just sent, shown until the transcript has it
  busy: false,
};

class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

// -- the API -----------------------------------------------------------------------------------

function authHeaders() {
  return { Authorization: `Bearer ${state.key}` };
}

async function api(method, path, body) {
  const headers = authHeaders();
  const init = { method, headers };
  if (body !== undefined) {
    headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  let response;
  try {
    response = await fetch(path, init);
  } catch (error) {
    throw new ApiError(0, `the gateway cannot be reached (${error.message})`);
  }
  const text = await response.text();
  let data = null;
  if (text) {
    try {
      data = JSON.parse(text);
    } catch {
      data = null;
    }
  }
  if (!response.ok) throw errorOf(response, data);
  return data;
}

function errorOf(response, data) {
  const message =
    data && typeof data.error === "string"
      ? data.error
      : `${response.status} ${response.statusText || "error"}`;
  const error = new ApiError(response.status, message);
  if (response.status === 401) askForKey("The gateway refused the API key: " + message);
  return error;
}

const segment = (value) => encodeURIComponent(value);

// Server-sent events from a fetch() response: yields {event, data, id} as the stream defines
// them (a blank line ends an event; `data:` lines join with newlines; `:` starts a comment).
async function* serverSentEvents(response) {
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  let event = "";
  let data = [];
  let id = null;
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buffer += value;
      const lines = buffer.split(/\r\n|\r|\n/);
      buffer = lines.pop(); // an unfinished line waits for the next chunk
      for (const line of lines) {
        if (line === "") {
          if (data.length) yield { event: event || "message", data: data.join("\n"), id };
          event = "";
          data = [];
          id = null;
          continue;
        }
        if (line.startsWith(":")) continue;
        const colon = line.indexOf(":");
        const field = colon === -1 ? line : line.slice(0, colon);
        let fieldValue = colon === -1 ? "" : line.slice(colon + 1);
        if (fieldValue.startsWith(" ")) fieldValue = fieldValue.slice(1);
        if (field === "event") event = fieldValue;
        else if (field === "data") data.push(fieldValue);
        else if (field === "id") id = fieldValue;
      }
    }
  } finally {
    reader.releaseLock();
  }
}

// -- the key -----------------------------------------------------------------------------------

function askForKey(why) {
  if (why) showAlert(why);
  const dialog = $("key-dialog");
  if (!dialog.open) {
    $("key").value = "";
    dialog.showModal();
  }
}

$("key-form").addEventListener("submit", (event) => {
  const key = $("key").value.trim();
  if (!key) {
    event.preventDefault();
    return;
  }
  state.key = key;
  localStorage.setItem(KEY_STORAGE, key);
  clearAlert();
  start();
});

$("change-key").addEventListener("click", () => askForKey());

// -- alerts and status -------------------------------------------------------------------------

function showAlert(message) {
  const alert = $("alert");
  alert.textContent = message;
  alert.hidden = false;
}

function clearAlert() {
  $("alert").hidden = true;
  $("alert").textContent = "";
}

function updateWorking() {
  const waiting = [...state.approvals.values()].some((calls) => calls.length);
  let text = "";
  if (state.session && !state.session.open) text = "This chat has ended.";
  else if (waiting) text = "Waiting for your approval.";
  else if (state.busy) text = "The agent is working…";
  $("working").textContent = text;
  $("transcript").setAttribute("aria-busy", state.busy ? "true" : "false");
}

// -- agents ------------------------------------------------------------------------------------

async function loadAgents() {
  const select = $("agent");
  const data = await api("GET", "/api/agents");
  state.agents = data.agents;
  select.replaceChildren(
    ...state.agents.map((agent) => {
      const option = document.createElement("option");
      option.value = agent.name;
      option.textContent = agent.name;
      return option;
    }),
  );
  if (!state.agents.length) {
    const option = document.createElement("option");
    option.value = "";
    option.textContent = "No agent for this key";
    select.append(option);
  }
  select.disabled = !state.agents.length;
  $("new-chat").disabled = !state.agents.length;
  describeAgent();
}

function describeAgent() {
  const agent = state.agents.find((a) => a.name === $("agent").value);
  const description = $("agent-description");
  description.textContent = agent && agent.description ? agent.description : "";
  description.hidden = !description.textContent;
}

$("agent").addEventListener("change", describeAgent);

$("start").addEventListener("submit", async (event) => {
  event.preventDefault();
  const agent = $("agent").value;
  if (!agent) return;
  $("new-chat").disabled = true;
  try {
    const data = await api("POST", "/api/sessions", { agent });
    clearAlert();
    // The hashchange listener opens it.
    location.hash = `session=${encodeURIComponent(data.session_id)}`;
  } catch (error) {
    showAlert(`Could not start a chat: ${error.message}`);
  } finally {
    $("new-chat").disabled = false;
  }
});

// -- the session -------------------------------------------------------------------------------

function sessionFromAddress() {
  const params = new URLSearchParams(location.hash.slice(1));
  return params.get("session");
}

function resetChat() {
  if (state.stream) state.stream.abort();
  state.stream = null;
  state.session = null;
  state.lastIndex = -1;
  state.lastTurnId = null;
  state.toolNames.clear();
  state.approvals.clear();
  state.pendingUser = null;
  state.busy = false;
  $("transcript").replaceChildren();
  $("approval-list").replaceChildren();
  $("approvals").hidden = true;
  clearLive();
}

async function openSession(sessionId) {
  resetChat();
  if (!sessionId) {
    $("chat").hidden = true;
    $("welcome").hidden = false;
    return;
  }
  let data;
  try {
    data = await api("GET", `/api/sessions/${segment(sessionId)}`);
  } catch (error) {
    showAlert(`Could not open the chat: ${error.message}`);
    $("chat").hidden = true;
    $("welcome").hidden = false;
    return;
  }
  if (sessionFromAddress() !== sessionId) return; // the address moved on meanwhile
  state.session = { id: data.session_id, agent: data.agent, open: data.open };
  $("chat-title").textContent = `Chat with ${data.agent}`;
  $("session-state").textContent = `session ${data.session_id}`;
  if (state.agents.some((a) => a.name === data.agent)) {
    $("agent").value = data.agent;
    describeAgent();
  }
  data.messages.forEach((message, index) => addMessage(index, message, null));
  state.busy = data.open && turnRunning(data.messages);
  setOpen(data.open);
  $("welcome").hidden = true;
  $("chat").hidden = false;
  updateWorking();
  scrollToEnd();
  if (data.open) follow(state.session.id);
  $("message").focus();
}

// Whether the transcript's last turn is still going: its last message is not a final answer.
function turnRunning(messages) {
  if (!messages.length) return false;
  const last = messages[messages.length - 1];
  return !(last.role === "assistant" && last.stop_reason !== "toolUse");
}

function setOpen(open) {
  state.session.open = open;
  for (const element of [$("message"), $("send"), $("end-chat")]) element.disabled = !open;
  if (!open) {
    state.busy = false;
    state.approvals.clear();
    renderApprovals();
    clearLive();
  }
  updateWorking();
}

window.addEventListener("hashchange", () => {
  const sessionId = sessionFromAddress();
  if (sessionId !== (state.session && state.session.id)) openSession(sessionId);
});

$("end-chat").addEventListener("click", async () => {
  if (!state.session) return;
  try {
    await api("POST", `/api/sessions/${segment(state.session.id)}/close`);
  } catch (error) {
    showAlert(`Could not end the chat: ${error.message}`);
  }
});

// The session's events, from the message after the last one shown, for as long as the chat is
// open here; a dropped connection is resumed (Last-Event-ID) after a short wait.
async function follow(sessionId) {
  const controller = new AbortController();
  state.stream = controller;
  let wait = RETRY_MIN_MS;
  while (!controller.signal.aborted) {
    try {
      const headers = { ...authHeaders(), Accept: "text/event-stream" };
      let url = `/api/sessions/${segment(sessionId)}/events`;
      if (state.lastIndex >= 0) {
        headers["Last-Event-ID"] = String(state.lastIndex);
        url += `?after=${state.lastIndex}`;
      }
      const response = await fetch(url, { headers, signal: controller.signal });
      if (!response.ok) {
        let data = null;
        try {
          data = await response.json();
        } catch {
          data = null;
        }
        const error = errorOf(response, data);
        // A request the gateway refuses will be refused again: say so and stop.
        if (response.status >= 400 && response.status < 500 && response.status !== 429) {
          showAlert(`The chat's events cannot be read: ${error.message}`);
          return;
        }
        throw error;
      }
      clearLive(); // a call's live text is sent again from its start
      for await (const event of serverSentEvents(response)) {
        wait = RETRY_MIN_MS;
        if (handleEvent(event) === "end") return;
      }
    } catch (error) {
      if (controller.signal.aborted) return;
      $("working").textContent = `Reconnecting… (${error.message})`;
    }
    await new Promise((resolve) => setTimeout(resolve, wait));
    wait = Math.min(wait * 2, RETRY_MAX_MS);
  }
}

function handleEvent(event) {
  let data;
  try {
    data = JSON.parse(event.data);
  } catch {
    return null;
  }
  switch (event.event) {
    case "message":
      if (data.web_ui && data.turn_id) linkTurn(data.turn_id, data.web_ui);
      addMessage(data.index, data.message, data.turn_id);
      break;
    case "text":
      showLiveText(data.text);
      break;
    case "restarted":
      $("live-text").textContent = "";
      break;
    case "tool_call":
      showLiveTool(data.name, data.call_id);
      break;
    case "approval":
      state.approvals.set(data.turn_id, data.calls);
      renderApprovals();
      break;
    case "end":
      setOpen(false);
      return "end";
    default:
      break;
  }
  updateWorking();
  return null;
}

// -- the transcript ----------------------------------------------------------------------------

function element(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

// Arguments on one line when they are short, indented when they are not.
function argumentsText(value) {
  const compact = JSON.stringify(value || {});
  return compact.length <= 80 ? compact : JSON.stringify(value, null, 2);
}

function textOf(blocks) {
  return (blocks || [])
    .filter((block) => block.type === "text")
    .map((block) => block.text)
    .join("\n");
}

function otherBlocks(blocks) {
  return (blocks || []).filter((block) => block.type !== "text").map((block) => block.type);
}

function addMessage(index, message, turnId) {
  if (index <= state.lastIndex) return; // already shown (a resumed stream may repeat one)
  state.lastIndex = index;
  const transcript = $("transcript");
  if (turnId && turnId !== state.lastTurnId) {
    state.lastTurnId = turnId;
    transcript.append(turnMark(turnId));
  }
  const text = textOf(message.content);
  if (message.role === "user" && text && state.pendingUser) {
    state.pendingUser.remove();
    state.pendingUser = null;
  }
  if (message.role === "assistant") {
    clearLive();
    state.busy = message.stop_reason === "toolUse";
  }
  const item = renderMessage(message);
  item.append(forkButton(index));
  transcript.append(item);
  scrollToEnd();
}

// "Fork from here": a new chat whose conversation is this one's up to and with this message
// (POST /api/sessions/{id}/fork, counted from 1); the page then opens it.
function forkButton(index) {
  const button = element("button", "fork", "Fork from here");
  button.type = "button";
  button.setAttribute("aria-label", `Fork from message ${index + 1}`);
  button.addEventListener("click", async () => {
    if (!state.session) return;
    button.disabled = true;
    try {
      const path = `/api/sessions/${segment(state.session.id)}/fork`;
      const data = await api("POST", path, { at: index + 1 });
      clearAlert();
      location.hash = `session=${encodeURIComponent(data.session_id)}`;
    } catch (error) {
      showAlert(`Could not fork the chat: ${error.message}`);
    } finally {
      button.disabled = false;
    }
  });
  return button;
}

function renderMessage(message) {
  const item = element("li", `message ${message.role}`);
  const results = Object.entries(message.tool_results || {});
  const calls = Object.entries(message.tool_calls || {});
  const text = textOf(message.content);
  if (message.role === "user" && !text && results.length) item.classList.add("results");
  item.append(element("div", "who", message.role === "user" ? (text ? "You" : "Tools") : "Agent"));
  if (text) item.append(element("div", "text", text));
  const others = otherBlocks(message.content);
  if (others.length) item.append(element("div", "muted", `(${others.join(", ")} not shown)`));
  for (const [callId, call] of calls) {
    state.toolNames.set(callId, call.name);
    const box = element("div", "tool-call");
    const head = element("div", "tool-head");
    head.append(element("span", "label", "Tool call "), element("strong", "", call.name), " ");
    head.append(element("code", "call-id", callId));
    box.append(head, element("pre", "arguments", argumentsText(call.arguments)));
    item.append(box);
  }
  for (const [callId, result] of results) {
    const details = element("details", "tool-result");
    const summary = element("summary");
    const name = state.toolNames.get(callId) || "tool";
    summary.append(`Result of ${name} `, element("code", "call-id", callId));
    if (result.isError) summary.append(" ", element("span", "error-badge", "error"));
    details.append(summary, element("pre", "", textOf(result.content) || "(no text)"));
    item.append(details);
  }
  if (message.stop_reason && !["endTurn", "toolUse"].includes(message.stop_reason)) {
    item.append(element("div", "muted", `stopped: ${message.stop_reason}`));
  }
  return item;
}

function turnMark(turnId) {
  const mark = element("li", "turn-mark");
  mark.dataset.turnId = turnId;
  fillTurnMark(mark);
  return mark;
}

function fillTurnMark(mark) {
  const turnId = mark.dataset.turnId;
  const url = state.webUi.get(turnId);
  mark.replaceChildren("Turn ", element("code", "", turnId));
  if (url) {
    const link = element("a", "", "open in Temporal Web UI");
    link.href = url;
    link.target = "_blank";
    link.rel = "noopener noreferrer";
    mark.append(" · ", link);
  }
}

function linkTurn(turnId, url) {
  if (!url || state.webUi.get(turnId) === url) return;
  state.webUi.set(turnId, url);
  for (const mark of $("transcript").querySelectorAll(".turn-mark")) {
    if (mark.dataset.turnId === turnId) fillTurnMark(mark);
  }
}

function scrollToEnd() {
  const end = $("composer");
  if (end.scrollIntoView) end.scrollIntoView({ block: "end" });
}

// -- live text ---------------------------------------------------------------------------------

function showLiveText(text) {
  const live = $("live");
  live.hidden = false;
  $("live-text").textContent += text;
  state.busy = true;
}

function showLiveTool(name, callId) {
  const live = $("live");
  live.hidden = false;
  const item = element("li", "", "Calling ");
  item.append(element("strong", "", name), " ", element("code", "call-id", callId));
  $("live-tools").append(item);
  state.busy = true;
}

function clearLive() {
  $("live").hidden = true;
  $("live-text").textContent = "";
  $("live-tools").replaceChildren();
}

// -- sending -----------------------------------------------------------------------------------

$("composer").addEventListener("submit", async (event) => {
  event.preventDefault();
  const input = $("message");
  const text = input.value.trim();
  if (!text || !state.session || !state.session.open) return;
  $("send").disabled = true;
  const pending = element("li", "message user sending");
  pending.append(element("div", "who", "You (sending)"), element("div", "text", text));
  $("transcript").append(pending);
  // Shown as sent until the transcript has it (its event may come before this answer).
  if (state.pendingUser) state.pendingUser.remove();
  state.pendingUser = pending;
  scrollToEnd();
  try {
    const data = await api("POST", `/api/sessions/${segment(state.session.id)}/messages`, {
      text,
    });
    input.value = "";
    clearAlert();
    if (data.web_ui) linkTurn(data.turn_id, data.web_ui);
    state.busy = true;
    updateWorking();
  } catch (error) {
    pending.remove();
    if (state.pendingUser === pending) state.pendingUser = null;
    showAlert(`Could not send: ${error.message}`);
  } finally {
    $("send").disabled = !(state.session && state.session.open);
    input.focus();
  }
});

$("message").addEventListener("keydown", (event) => {
  if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
    event.preventDefault();
    $("composer").requestSubmit();
  }
});

// -- approvals ---------------------------------------------------------------------------------

// One item per waiting call, keyed by call id: a re-render keeps what the user is typing.
function renderApprovals() {
  const list = $("approval-list");
  const waiting = new Map();
  for (const [turnId, calls] of state.approvals) {
    for (const call of calls) waiting.set(call.call_id, { turnId, call });
  }
  for (const item of [...list.children]) {
    if (!waiting.has(item.dataset.callId)) item.remove();
  }
  const shown = new Set([...list.children].map((item) => item.dataset.callId));
  for (const [callId, { turnId, call }] of waiting) {
    if (!shown.has(callId)) list.append(approvalItem(turnId, call));
  }
  $("approvals").hidden = waiting.size === 0;
  updateWorking();
}

function approvalItem(turnId, call) {
  const item = $("approval-template").content.firstElementChild.cloneNode(true);
  item.dataset.callId = call.call_id;
  item.querySelector(".tool").textContent = call.name;
  item.querySelector(".call-id").textContent = call.call_id;
  if (call.agent) item.querySelector(".agent").textContent = `in agent ${call.agent}`;
  item.querySelector(".arguments").textContent = argumentsText(call.arguments);
  item.setAttribute("aria-label", `${call.name} waits for approval`);
  const form = item.querySelector("form");
  const editor = item.querySelector(".editor");
  const edited = item.querySelector(".edited");
  const editButton = item.querySelector(".edit");
  const problem = item.querySelector(".decide-error");
  // Each item's labels point at its own fields.
  for (const [field, name] of [
    [item.querySelector(".reason"), "reason"],
    [edited, "arguments"],
  ]) {
    field.id = `${name}-${call.call_id}`;
  }
  edited.value = JSON.stringify(call.arguments || {}, null, 2);
  // Enter in the reason must not decide: the form's first button (Approve) would take it.
  item.querySelector(".reason").addEventListener("keydown", (event) => {
    if (event.key === "Enter") event.preventDefault();
  });
  editButton.addEventListener("click", () => {
    editor.hidden = !editor.hidden;
    editButton.setAttribute("aria-expanded", String(!editor.hidden));
    if (!editor.hidden) edited.focus();
  });
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const choice = event.submitter ? event.submitter.value : "approve";
    const reason = item.querySelector(".reason").value.trim() || null;
    const body = { approve: choice !== "deny", reason, arguments: null };
    if (choice === "edited") {
      let parsed;
      try {
        parsed = JSON.parse(edited.value);
      } catch (error) {
        showProblem(problem, `The arguments are not JSON: ${error.message}`);
        return;
      }
      if (parsed === null || typeof parsed !== "object" || Array.isArray(parsed)) {
        showProblem(problem, "The arguments must be a JSON object.");
        return;
      }
      body.arguments = parsed;
    }
    const buttons = form.querySelectorAll("button");
    for (const button of buttons) button.disabled = true;
    problem.hidden = true;
    try {
      await api(
        "POST",
        `/api/turns/${segment(turnId)}/approvals/${segment(call.call_id)}`,
        body,
      );
      forget(turnId, call.call_id);
    } catch (error) {
      if (error.status === 409) {
        forget(turnId, call.call_id); // decided elsewhere, or the turn moved on
        showAlert(`${call.name} (${call.call_id}): ${error.message}`);
        return;
      }
      showProblem(problem, error.message);
      for (const button of buttons) button.disabled = false;
    }
  });
  return item;
}

function showProblem(node, message) {
  node.textContent = message;
  node.hidden = false;
}

function forget(turnId, callId) {
  const calls = state.approvals.get(turnId) || [];
  state.approvals.set(
    turnId,
    calls.filter((call) => call.call_id !== callId),
  );
  renderApprovals();
}

// -- start -------------------------------------------------------------------------------------

async function start() {
  if (!state.key) {
    askForKey();
    return;
  }
  try {
    await loadAgents();
  } catch (error) {
    if (error.status !== 401) showAlert(`Could not list the agents: ${error.message}`);
    return;
  }
  await openSession(sessionFromAddress());
}

start();
