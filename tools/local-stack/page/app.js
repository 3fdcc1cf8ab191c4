// The local stack's live page. Plain JavaScript, no build step, no network beyond the stack itself:
// the REST API on this origin, the WebSocket API at the address /local/stack.json gives.
'use strict';

const state = {
  services: {},            // service → table
  resources: [],           // services that drive a resource (no items of their own)
  socket: null,
  watched: new Map(),      // topic → {service, table, entity}
  items: new Map(),        // topic → last commit push, or the item as read when the page loaded
  transactions: new Map(), // transactionId → {record, httpStatus, source, elapsedMs, sentAt, decision?}
  pending: new Set(),      // topics asked for, not yet acknowledged
  waiting: new Map(),      // topic → callbacks to run when the WebSocket API acknowledges it
  refused: new Map(),      // topic → why the WebSocket API refused it (over the cap, or not this user's)
  auth: null,              // 'jwt' when the stack runs with --auth jwt
  token: null,             // the signed-in user's token (--auth jwt)
  user: null,              // the signed-in user's name (--auth jwt)
  websocket: null,         // the WebSocket API's URL
};

// With --auth jwt every call carries the signed-in user's token: `Authorization: Bearer` on the REST
// API, the `token` query parameter on the WebSocket (a browser cannot set headers on one).
const authorized = (headers = {}) => (state.token ? { ...headers, authorization: `Bearer ${state.token}` } : headers);
const socketUrl = () => (state.token ? `${state.websocket}/?token=${encodeURIComponent(state.token)}` : state.websocket);

// Signs in as a local user: a token of the stack's development issuer (POST /local/token), then the
// WebSocket again as that user. An admin and an operator are separate roles, each asked for on its own.
async function signIn(sub, admin, operator) {
  const response = await fetch('/local/token', { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ sub, admin, operator }) });
  const answer = await response.json().catch(() => ({}));
  if (!response.ok || !answer.token) {
    $('#user-status').textContent = `sign-in refused: ${answer.error?.message || answer.message || response.status}`;
    return;
  }
  state.token = answer.token;
  state.user = sub;
  localStorage.setItem('twopc.user', JSON.stringify({ sub, admin, operator }));
  const roles = [admin ? 'admin' : '', operator ? 'operator' : ''].filter(Boolean).join(', ');
  $('#user-status').textContent = `signed in as ${sub}${roles ? ` (${roles})` : ''}`;
  $('#user-status').dataset.user = sub;
  // The WebSocket again, as this user, at once (its close handler sees it is no longer the current one).
  const previous = state.socket;
  if (previous) {
    state.socket = null;
    $('#ws-status').textContent = `reconnecting as ${sub}`;
    $('#ws-status').className = 'badge pending';
    previous.close();
  }
  // The Operators panel, if this user is one.
  if (operators.checking) checkOperator();
}

const $ = (selector) => document.querySelector(selector);
const element = (tag, attributes = {}, ...children) => {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attributes)) {
    if (name === 'class') node.className = value;
    else if (name === 'text') node.textContent = value;
    else node.setAttribute(name, value);
  }
  for (const child of children) node.append(child);
  return node;
};
const short = (id) => (id && id.length > 14 ? `${id.slice(0, 14)}…` : id || '');
const entityTopic = (table, entity) => `entity:${table}:${entity}`;

// ---- the WebSocket API ---------------------------------------------------------------------

function connect(url) {
  const status = $('#ws-status');
  const socket = new WebSocket(url);
  state.socket = socket;
  socket.addEventListener('open', () => {
    status.textContent = 'connected';
    status.className = 'badge committed';
    send({ action: 'subscribe', topics: [...state.watched.keys()] });
  });
  socket.addEventListener('message', (event) => {
    let message;
    try { message = JSON.parse(event.data); } catch { return; }
    onPush(message);
  });
  socket.addEventListener('close', () => {
    status.textContent = 'disconnected, reconnecting';
    status.className = 'badge aborted';
    // Again as whoever is signed in then.
    setTimeout(() => connect(socketUrl()), state.socket === socket ? 1000 : 0);
  });
}

function send(message) {
  if (message.topics && message.topics.length === 0) return;
  if (state.socket && state.socket.readyState === WebSocket.OPEN) {
    for (const topic of message.topics || []) state.pending.add(topic);
    state.socket.send(JSON.stringify(message));
  }
}

function acknowledged(topic) {
  state.pending.delete(topic);
  for (const done of state.waiting.get(topic) || []) done();
  state.waiting.delete(topic);
}

function onPush(message) {
  if (Array.isArray(message.subscribed)) {
    for (const topic of message.subscribed) {
      acknowledged(topic);
      state.refused.delete(topic);
    }
    // Topics over the per-connection cap come back refused, each with the reason.
    for (const refused of message.refused || []) {
      acknowledged(refused.topic);
      state.refused.set(refused.topic, refused.reason);
    }
    renderItems();
  } else if (message.type === 'commit') {
    const topic = entityTopic(message.table, message.key && message.key.entityId);
    if (state.watched.has(topic)) {
      state.items.set(topic, message);
      renderItems(topic);
    }
    if (!state.transactions.has(message.transactionId)) {
      // A commit by another client: its record, from the REST API.
      state.transactions.set(message.transactionId, { source: 'stream', sentAt: Date.now() });
      refresh(message.transactionId);
    }
  } else if (message.type === 'transaction') {
    refresh(message.transactionId);
  } else if (message.error) {
    console.warn('the WebSocket API refused a message', message.error);
  }
}

// Follows an item; resolves once the WebSocket API has acknowledged the topic (or after 3 s, so a
// closed socket never holds a form back). A form waits for it before it sends its transaction: a
// commit made before the subscription is written would reach nobody, and the REST API has no item
// read to fill the row in afterwards (the stack's /local/items is read once, when the page loads).
function watch(service, entity) {
  const table = state.services[service];
  if (!table || !entity) return Promise.resolve();
  const topic = entityTopic(table, entity);
  if (!state.watched.has(topic)) {
    state.watched.set(topic, { service, table, entity });
    localStorage.setItem('twopc.watched', JSON.stringify([...state.watched.values()].map((w) => [w.service, w.entity])));
    send({ action: 'subscribe', topics: [topic] });
    renderItems();
  }
  if (!state.pending.has(topic)) return Promise.resolve();
  return new Promise((resolve) => {
    state.waiting.set(topic, [...(state.waiting.get(topic) || []), resolve]);
    setTimeout(resolve, 3000);
  });
}

// ---- the REST API --------------------------------------------------------------------------

async function submit(body, { key, label }) {
  const headers = { 'content-type': 'application/json' };
  if (key) headers['idempotency-key'] = key;
  const sentAt = Date.now();
  const local = `sending-${sentAt}-${Math.random()}`;
  state.transactions.set(local, { source: 'page', label, sentAt, sending: true });
  renderTransactions();
  let response; let answer;
  try {
    response = await fetch('/transactions', { method: 'POST', headers: authorized(headers), body: typeof body === 'string' ? body : JSON.stringify(body) });
    answer = await response.json().catch(() => ({}));
  } catch (error) {
    state.transactions.set(local, { source: 'page', label, sentAt, failure: `the REST API did not answer: ${error}` });
    renderTransactions();
    return null;
  }
  state.transactions.delete(local);
  const elapsedMs = Date.now() - sentAt;
  if (!answer.transactionId) {
    const error = answer.error ? `${answer.error.code}: ${answer.error.message}` : answer.message || JSON.stringify(answer);
    state.transactions.set(local, { source: 'page', label, sentAt, httpStatus: response.status, failure: error });
    renderTransactions();
    return { status: response.status, answer };
  }
  const id = answer.transactionId;
  state.transactions.set(id, { ...(state.transactions.get(id) || {}), record: answer, httpStatus: response.status, source: 'page', label, sentAt, elapsedMs });
  if (!isTerminal(answer.status)) {
    // Decided but not applied everywhere yet, or held for a decision: the push on tx:<id> says when it ends.
    send({ action: 'subscribe', topics: [`tx:${id}`] });
    followUp(id, answer);
  }
  renderTransactions();
  return { status: response.status, answer };
}

const isTerminal = (status) => status === 'COMMITTED' || status === 'ABORTED';
// How far a status is along: a held transaction is PREPARED before it is decided.
const progress = (status) => ({ PREPARING: 0, PREPARED: 1, COMMITTING: 2, ABORTING: 2, COMMITTED: 3, ABORTED: 3 })[status] ?? 0;

async function refresh(id) {
  let response;
  try { response = await fetch(`/transactions/${encodeURIComponent(id)}`, { headers: authorized() }); } catch { return; }
  // 200 with the record whatever its state (the body's status tells it); 404 and 503 without.
  const record = await response.json().catch(() => ({}));
  if (!record.transactionId || !record.status) return;
  const entry = state.transactions.get(id) || { source: 'stream', sentAt: Date.now() };
  // Answers can cross: an older COMMITTING never replaces a COMMITTED already shown, nor PREPARED a decision.
  if (entry.record && progress(record.status) < progress(entry.record.status)) return;
  state.transactions.set(id, { ...entry, record });
  renderTransactions();
  followUp(id, record);
}

// A transaction not ended yet is read again: a held one once its hold has passed (its caller's decision
// or its end arrives on tx:<id> before that), any other in a second.
function followUp(id, record) {
  if (isTerminal(record.status)) return;
  const wait = record.status === 'PREPARED' && record.holdUntil ? Math.max(1000, record.holdUntil - Date.now() + 1000) : 1000;
  setTimeout(() => refresh(id), wait);
}

// ---- held transactions ("decide later") ------------------------------------------------------

const isHeld = (entry) => Boolean(entry.record && entry.record.holdUntil);

// A form's hold in milliseconds, when "Decide later" is ticked.
function holdMsOf(form) {
  if (!form.hold.checked) return undefined;
  const seconds = form.holdSeconds.value.trim();
  if (!/^\d+(\.\d+)?$/.test(seconds)) throw new Error(`hold ${JSON.stringify(seconds)} is not a number of seconds`);
  return Math.round(Number(seconds) * 1000);
}

// Approve (`commit`) or Reject (`abort`) a held transaction: POST /transactions/{id}/commit or /abort.
async function decide(id, route) {
  const entry = state.transactions.get(id);
  if (!entry) return;
  state.transactions.set(id, { ...entry, deciding: route, decisionError: undefined });
  renderTransactions();
  let response; let answer;
  try {
    response = await fetch(`/transactions/${encodeURIComponent(id)}/${route}`, { method: 'POST', headers: authorized({ 'content-type': 'application/json' }) });
    answer = await response.json().catch(() => ({}));
  } catch (error) {
    state.transactions.set(id, { ...state.transactions.get(id), deciding: undefined, decisionError: `the REST API did not answer: ${error}` });
    renderTransactions();
    return;
  }
  const current = state.transactions.get(id);
  const decision = { route, httpStatus: response.status };
  if (answer.transactionId && answer.status) {
    // A push may have brought the end first: what is further along stays.
    const record = current.record && progress(answer.status) < progress(current.record.status) ? current.record : answer;
    state.transactions.set(id, { ...current, record, decision, deciding: undefined });
    followUp(id, record);
  } else {
    // 404 (unknown, or another principal's), 409 NOT_HELD, 503 still preparing: the error, as the API says it.
    const error = answer.error ? `${answer.error.code}: ${answer.error.message}` : answer.message || JSON.stringify(answer);
    state.transactions.set(id, { ...current, decision, deciding: undefined, decisionError: `HTTP ${response.status} ${error}` });
  }
  renderTransactions();
}

const clockTime = (epochMs) => new Date(epochMs).toLocaleTimeString([], { hour12: false });

// "0:42 left" until holdUntil, then that it has passed.
function countdown(holdUntil) {
  const left = holdUntil - Date.now();
  if (left <= 0) return `holdUntil ${clockTime(holdUntil)} · passed: it aborts (the sweeper ends it)`;
  const seconds = Math.ceil(left / 1000);
  return `holdUntil ${clockTime(holdUntil)} · ${Math.floor(seconds / 60)}:${String(seconds % 60).padStart(2, '0')} left`;
}

// The countdowns, between renders (a render would replace the buttons under the pointer).
function tickCountdowns() {
  for (const node of document.querySelectorAll('#held [data-hold-until]')) {
    const holdUntil = Number(node.dataset.holdUntil);
    node.textContent = countdown(holdUntil);
    node.classList.toggle('expired', holdUntil <= Date.now());
  }
}

// How a held transaction ended: approved, rejected or expired, and its status.
function heldOutcome(entry) {
  const { record, decision } = entry;
  const expired = /hold expired/.test(record.reason || '');
  const how = expired ? 'expired' : decision ? (decision.route === 'commit' ? 'approved' : 'rejected') : 'decided elsewhere';
  return `${how} → ${record.status}${decision ? ` (HTTP ${decision.httpStatus})` : ''}`;
}

function renderHeld() {
  const held = [...state.transactions.entries()].filter(([, entry]) => isHeld(entry))
    .sort((a, b) => b[1].sentAt - a[1].sentAt).slice(0, 20);
  $('#held-empty').hidden = held.length > 0;
  $('#held').replaceChildren(...held.map(([id, entry]) => {
    const { record } = entry;
    const item = element('li', { class: 'card held', 'data-tx': id, 'data-status': record.status },
      element('div', { class: 'head' },
        element('span', { class: `badge ${record.status.toLowerCase()}`, text: record.status }),
        element('span', { class: 'label', text: entry.label || 'seen on the stream' }),
        element('code', { class: 'muted', text: id })));
    if (record.status === 'PREPARED') {
      const expired = record.holdUntil <= Date.now();
      item.append(element('p', { class: `countdown${expired ? ' expired' : ''}`, 'data-hold-until': String(record.holdUntil), text: countdown(record.holdUntil) }));
      const approve = element('button', { type: 'button', class: 'approve', text: entry.deciding === 'commit' ? 'Approving…' : 'Approve' });
      const reject = element('button', { type: 'button', class: 'reject', text: entry.deciding === 'abort' ? 'Rejecting…' : 'Reject' });
      approve.disabled = reject.disabled = Boolean(entry.deciding);
      approve.addEventListener('click', () => decide(id, 'commit'));
      reject.addEventListener('click', () => decide(id, 'abort'));
      item.append(element('div', { class: 'actions' }, approve, reject));
    } else {
      item.append(element('p', { class: 'outcome', text: heldOutcome(entry) }));
      if (record.reason) item.append(element('p', { class: 'reason', text: record.reason }));
    }
    if (entry.decisionError) item.append(element('p', { class: 'error', text: entry.decisionError }));
    return item;
  }));
}

// ---- the operators' API (/admin) ------------------------------------------------------------

// Whether the caller is one of the operators the policy names, as the API says it: GET
// /admin/transactions answers 200 to an operator, 403 to anyone else. Only an operator sees the panel
// and its buttons; anyone else has none in the page at all.
const operators = {
  operator: false,         // the last answer said so
  detail: null,            // the transaction whose detail is shown
  acting: new Set(),       // `${id} ${action}` sent, not answered yet
  checking: 0,             // which check is the current one (a sign-in starts another)
};

function ageText(ms) {
  const seconds = Math.round(ms / 1000);
  if (seconds < 60) return `${seconds} s`;
  if (seconds < 3600) return `${Math.floor(seconds / 60)} min${seconds % 60 ? ` ${seconds % 60} s` : ''}`;
  return `${(seconds / 3600).toFixed(1)} h`;
}
const apiError = (answer, response) => (answer.error ? `${answer.error.code}: ${answer.error.message}` : answer.message || `HTTP ${response.status}`);

async function adminGet(path) {
  const response = await fetch(path, { headers: authorized() });
  const answer = await response.json().catch(() => ({}));
  return { response, answer };
}

// Asks whether the caller is an operator, with the first page of open transactions; shows or hides
// the panel. Called when the page starts and after each sign-in.
async function checkOperator() {
  const check = ++operators.checking;
  let listed;
  try { listed = await adminGet(operatorListPath()); } catch { listed = null; }
  if (check !== operators.checking) return;
  const operator = Boolean(listed && listed.response.ok);
  setOperator(operator);
  // Who was asked about, and the answer (the browser tests wait for it).
  Object.assign($('#operators-section').dataset, { checkedFor: state.user || '', operator: String(operator) });
  if (operator) {
    renderOpen(listed.answer);
    refreshStuck();
  }
}

function setOperator(operator) {
  operators.operator = operator;
  $('#operators-section').hidden = !operator;
  if (!operator) {
    // Nothing of an operator's left behind for whoever signs in next: no rows, no buttons.
    for (const id of ['#operator-open', '#operator-stuck', '#operator-stuck-locks']) $(`${id} tbody`).replaceChildren();
    $('#operator-detail').replaceChildren();
    $('#operator-detail').hidden = true;
    $('#operator-answer').hidden = true;
    operators.detail = null;
  }
}

function operatorListPath() {
  const status = $('#operators-status').value;
  return `/admin/transactions?limit=100${status ? `&status=${encodeURIComponent(status)}` : ''}`;
}

function stuckPath() {
  const seconds = $('#operators-lock-age').value.trim();
  return /^\d+$/.test(seconds) ? `/admin/stuck?lockAgeMs=${Number(seconds) * 1000}` : '/admin/stuck';
}

// Both lists again (every few seconds while the panel shows, at once after an action).
async function refreshOperators() {
  if (!operators.operator) return;
  const check = operators.checking;
  let listed;
  try { listed = await adminGet(operatorListPath()); } catch { return; }
  if (check !== operators.checking || !operators.operator) return;
  if (listed.response.status === 403) { setOperator(false); return; }
  if (listed.response.ok) renderOpen(listed.answer);
  await refreshStuck();
}

async function refreshStuck() {
  const check = operators.checking;
  let stuck;
  try { stuck = await adminGet(stuckPath()); } catch { return; }
  if (check !== operators.checking || !operators.operator || !stuck.response.ok) return;
  renderStuck(stuck.answer);
}

// The rows of `tbody` as `list` says, each kept by its key: a row already shown is updated in place,
// so that the buttons under the pointer stay the same elements across refreshes.
function syncRows(tbody, list, keyOf, build, update) {
  const existing = new Map([...tbody.children].map((row) => [row.dataset.key, row]));
  const rows = list.map((entry) => {
    const key = keyOf(entry);
    const row = existing.get(key) || build(entry, key);
    existing.delete(key);
    update(row, entry);
    return row;
  });
  for (const gone of existing.values()) gone.remove();
  rows.forEach((row, i) => { if (tbody.children[i] !== row) tbody.insertBefore(row, tbody.children[i] || null); });
}

// The status as recorded (`recordedStatus`: ABORTING where an answer says ABORTED), what is left to do.
const recorded = (record) => record.recordedStatus || record.status;
const votesText = (record) => (record.participants || []).map((p) => `${p.service} ${p.vote || 'no vote'}${p.code ? ` ${p.code}` : ''}`).join(' · ');
const sweepsText = (record) => `${record.sweepAttempts || 0}${record.lastError ? ` · ${record.lastError}` : ''}`;

// A transaction's row: its id (opens its detail), status, age, votes, sweeps, and the two actions.
function transactionRow(columns) {
  return (record, key) => {
    const row = element('tr', { class: 'operator-tx', 'data-key': key, 'data-tx': record.transactionId });
    const show = element('button', { type: 'button', class: 'link operator-show', title: 'Show its detail' }, element('code', { text: record.transactionId }));
    show.addEventListener('click', () => showDetail(record.transactionId));
    row.append(element('td', {}, show));
    for (const name of columns) row.append(element('td', { class: name }));
    row.append(element('td', { class: 'actions' }, ...actionButtons(record.transactionId)));
    return row;
  };
}

function actionButtons(id) {
  const retry = element('button', { type: 'button', class: 'operator-retry', 'data-action': 'retry', title: 'POST /admin/transactions/{id}/retry: drive a decided transaction to its end now', text: 'Retry' });
  const abort = element('button', { type: 'button', class: 'operator-abort reject', 'data-action': 'abort', title: 'POST /admin/transactions/{id}/abort: abort an undecided transaction', text: 'Abort' });
  retry.addEventListener('click', () => operatorAction(id, 'retry'));
  abort.addEventListener('click', () => operatorAction(id, 'abort'));
  for (const button of [retry, abort]) button.disabled = operators.acting.has(`${id} ${button.dataset.action}`);
  return [retry, abort];
}

function updateTransactionRow(row, record, why) {
  row.dataset.status = recorded(record);
  const cell = (name) => row.querySelector(`td.${name}`);
  cell('status').replaceChildren(element('span', { class: `badge ${recorded(record).toLowerCase()}`, text: recorded(record) }));
  cell('age').textContent = ageText(record.ageMs || 0);
  if (cell('votes')) {
    cell('votes').replaceChildren(...(record.participants || []).map((p) =>
      element('span', { class: 'participant', 'data-service': p.service },
        element('span', { text: `${p.service} ` }), element('span', { class: `vote ${(p.vote || '').toLowerCase()}`, text: p.vote || 'no vote' }))));
    cell('votes').title = votesText(record);
  }
  if (cell('why')) cell('why').textContent = why(record);
  cell('sweeps').textContent = sweepsText(record);
  for (const button of row.querySelectorAll('td.actions button')) button.disabled = operators.acting.has(`${record.transactionId} ${button.dataset.action}`);
}

function renderOpen(answer) {
  const list = answer.transactions || [];
  syncRows($('#operator-open tbody'), list, (r) => r.transactionId, transactionRow(['status', 'age', 'votes', 'sweeps']), (row, r) => updateTransactionRow(row, r));
  $('#operator-open-empty').hidden = list.length > 0;
  $('#operator-open-count').textContent = `${list.length}${answer.next ? '+ (the first page; `twopc-local admin list --next` for more)' : ''}`;
  $('#operators-updated').textContent = `read ${clockTime(Date.now())}`;
}

// Why an open transaction is in the stuck view: past what it waits for, and what the sweeper met.
function stuckWhy(record) {
  const now = Date.now();
  const passed = record.holdUntil && record.holdUntil <= now ? 'its hold passed'
    : record.deadline && record.deadline <= now ? 'its deadline passed' : 'past the sweeper\'s due time';
  return record.lastError ? `${passed}; the sweeper: ${record.lastError}` : passed;
}

function renderStuck(answer) {
  const list = answer.transactions || [];
  const locks = answer.locks || [];
  syncRows($('#operator-stuck tbody'), list, (r) => r.transactionId, transactionRow(['status', 'age', 'why', 'sweeps']), (row, r) => updateTransactionRow(row, r, stuckWhy));
  syncRows($('#operator-stuck-locks tbody'), locks, (l) => `${l.table} ${JSON.stringify(l.key)} ${l.lock && l.lock.transactionId}`,
    (l, key) => element('tr', { class: 'operator-lock', 'data-key': key, 'data-service': l.service, 'data-owner': (l.lock && l.lock.transactionId) || '' },
      element('td', { text: `${l.service} ${JSON.stringify(l.key)}` }), element('td', {}, element('code', { text: (l.lock && l.lock.transactionId) || '' })),
      element('td', { class: 'expired' }), element('td', { class: 'owner', text: l.ownerStatus || 'no record' }), element('td', { class: 'why', text: l.why || '' })),
    (row, l) => { row.querySelector('.expired').textContent = l.lock && l.lock.expiresAt ? `${ageText(Math.max(0, Date.now() - l.lock.expiresAt))} ago` : ''; });
  $('#operator-stuck').hidden = list.length === 0;
  $('#operator-stuck-locks').hidden = locks.length === 0;
  $('#operator-stuck-empty').hidden = list.length + locks.length > 0;
  $('#operator-stuck-count').textContent = `${answer.count ?? list.length + locks.length} · locks expired at least ${ageText(answer.lockAgeMs ?? 60_000)} ago`;
}

// POST /admin/transactions/{id}/retry or /abort, as every POST of the page (JSON), and its answer.
async function operatorAction(id, action) {
  const key = `${id} ${action}`;
  if (operators.acting.has(key)) return;
  operators.acting.add(key);
  for (const button of document.querySelectorAll(`#operators-section tr[data-tx="${CSS.escape(id)}"] button[data-action="${action}"], #operator-detail[data-tx="${CSS.escape(id)}"] button[data-action="${action}"]`)) button.disabled = true;
  let response; let answer;
  try {
    response = await fetch(`/admin/transactions/${encodeURIComponent(id)}/${action}`, { method: 'POST', headers: authorized({ 'content-type': 'application/json' }) });
    answer = await response.json().catch(() => ({}));
  } catch (error) {
    showAnswer(id, action, { text: `${action} ${id}: the REST API did not answer: ${error}`, error: true });
    return;
  } finally {
    operators.acting.delete(key);
  }
  if (answer.status && !answer.error) {
    // 200 with the record; 409 with it when a commit was decided first (an abort does not undo it).
    const note = response.status === 409 ? ': its commit was decided first, not undone' : '';
    showAnswer(id, action, { status: answer.status, http: response.status, text: `${action} ${id} → ${answer.status} (HTTP ${response.status})${note}`, error: response.status !== 200 });
  } else {
    // 409 NOT_DECIDED (a retry of an undecided one), 404, 403 (no longer an operator), 503.
    showAnswer(id, action, { http: response.status, code: answer.error && answer.error.code, text: `${action} ${id} → HTTP ${response.status} ${apiError(answer, response)}`, error: true });
    if (response.status === 403) { setOperator(false); return; }
  }
  // The page's own entry of it, if it has one, follows (its tx: push brings the end as well).
  if (state.transactions.has(id)) refresh(id);
  await refreshOperators();
  if (operators.detail === id) showDetail(id);
}

function showAnswer(id, action, { status = '', http = '', code = '', text, error = false }) {
  const node = $('#operator-answer');
  node.hidden = false;
  node.className = `card operator-answer${error ? ' error' : ''}`;
  Object.assign(node.dataset, { tx: id, action, status, http: String(http), code: code || '' });
  node.textContent = text;
}

// A transaction as an operator sees it: GET /admin/transactions/{id}.
async function showDetail(id) {
  operators.detail = id;
  const root = $('#operator-detail');
  root.hidden = false;
  root.dataset.tx = id;
  let shown;
  try { shown = await adminGet(`/admin/transactions/${encodeURIComponent(id)}`); } catch (error) {
    root.replaceChildren(element('p', { class: 'error', text: `the REST API did not answer: ${error}` }));
    return;
  }
  if (operators.detail !== id) return;
  if (shown.response.status === 403) { setOperator(false); return; }
  const record = shown.answer;
  if (!shown.response.ok || !record.transactionId) {
    root.replaceChildren(element('p', { class: 'error', text: `${id}: HTTP ${shown.response.status} ${apiError(record, shown.response)}` }));
    return;
  }
  root.dataset.status = recorded(record);
  const reload = element('button', { type: 'button', class: 'operator-reload', text: 'Reload' });
  const close = element('button', { type: 'button', class: 'operator-close', text: 'Close' });
  reload.addEventListener('click', () => showDetail(id));
  close.addEventListener('click', () => { operators.detail = null; root.hidden = true; root.replaceChildren(); });
  const fact = (name, value) => (value === undefined || value === null || value === '' ? null
    : element('tr', { 'data-field': name }, element('th', { text: name }), element('td', { text: String(value) })));
  const when = (ms) => (ms ? `${new Date(ms).toISOString()} (${ms <= Date.now() ? `${ageText(Date.now() - ms)} ago` : `in ${ageText(ms - Date.now())}`})` : null);
  const facts = [
    fact('age', ageText(record.ageMs || 0)), fact('reason', record.reason), fact('principal', record.principal),
    fact('attempt', record.attempt), fact('first attempt', record.firstTransactionId !== record.transactionId ? record.firstTransactionId : null),
    fact('deadline', when(record.deadline)), fact('holdUntil', when(record.holdUntil)), fact('sweepAt', when(record.sweepAt)),
    fact('sweeps', record.sweepAttempts), fact('last error', record.lastError),
  ].filter(Boolean);
  const participants = (record.participants || []).map((p) => element('tr', { 'data-service': p.service },
    element('td', { text: p.service }), element('td', { class: `vote ${(p.vote || '').toLowerCase()}`, text: p.vote || 'no vote' }),
    element('td', { class: 'code', text: [p.code, p.serviceCode].filter(Boolean).join(' ') }), element('td', { class: 'reason', text: p.reason || '' }),
    element('td', { class: 'muted', text: `${p.operations ?? ''} operation${p.operations === 1 ? '' : 's'}${p.readOnly ? ', read only' : ''}` })));
  const locks = (record.locks || []).flatMap((l) => (l.items || []).map((item) => element('tr', { class: 'lock', 'data-service': l.service, 'data-locked-by-it': String(Boolean(item.lockedByIt)) },
    element('td', { text: `${l.service} ${l.table || ''}` }), element('td', { class: 'key', text: JSON.stringify(item.key) }),
    element('td', { class: 'holder', text: item.lock ? (item.lockedByIt ? 'locked by it' : `locked by ${item.lock.transactionId}`) : 'not locked' }),
    element('td', { class: 'muted', text: item.lock && item.lock.expiresAt ? `expires ${when(item.lock.expiresAt)}` : '' }))));
  const audit = (record.audit || []).map((a) => element('tr', { class: 'audit' },
    element('td', { text: a.at ? new Date(a.at).toISOString() : '' }), element('td', { text: a.by || '' }), element('td', { text: a.action || '' }), element('td', { text: a.result || '' })));
  const table = (cls, head, rows, empty) => (rows.length
    ? element('table', { class: cls }, element('thead', {}, element('tr', {}, ...head.map((h) => element('th', { text: h })))), element('tbody', {}, ...rows))
    : element('p', { class: `muted ${cls}`, text: empty }));
  root.replaceChildren(
    element('div', { class: 'head' }, element('span', { class: `badge ${recorded(record).toLowerCase()}`, text: recorded(record) }), element('code', { text: id }),
      element('span', { class: 'actions' }, ...actionButtons(id), reload, close)),
    element('table', { class: 'facts' }, element('tbody', {}, ...facts)),
    element('h3', { text: 'Participants' }), table('participants', ['service', 'vote', 'code', 'reason', ''], participants, 'none'),
    element('h3', { text: 'Locks' }), table('locks', ['service', 'item', 'lock', ''], locks, 'no item'),
    element('h3', { text: 'Chain' }), element('p', { class: 'chain' }, ...(record.chain || [id]).flatMap((t, i) => [i ? ' → ' : '', element('code', { text: t })])),
    element('h3', { text: 'Audit' }), table('audit-log', ['at', 'by', 'action', 'result'], audit, 'no operator action yet'));
}

function setUpOperators() {
  $('#operators-form').addEventListener('submit', (event) => { event.preventDefault(); refreshOperators(); });
  $('#operators-status').addEventListener('change', () => refreshOperators());
  setInterval(refreshOperators, 3000);
}

// ---- forms ---------------------------------------------------------------------------------

function amountOf(text) {
  const value = text.trim();
  if (!/^\d+(\.\d+)?$/.test(value)) throw new Error(`amount ${JSON.stringify(text)} is not a positive decimal number`);
  return value;
}

function transferBody(form) {
  const amount = amountOf(form.amount.value);
  return {
    participants: [
      { service: form.fromService.value, operations: [{ op: 'add', key: { entityId: form.from.value.trim() }, field: 'balance', delta: `-${amount}`, min: 0 }] },
      { service: form.toService.value, operations: [{ op: 'add', key: { entityId: form.to.value.trim() }, field: 'balance', delta: amount }] },
    ],
    holdMs: holdMsOf(form),
  };
}

// " (held 60 s)" when the form holds its transaction.
const heldLabel = (form) => (form.hold.checked ? ` (held ${form.holdSeconds.value.trim()} s)` : '');

function orderBody(form) {
  const quantity = form.quantity.value.trim();
  if (!/^[1-9]\d*$/.test(quantity)) throw new Error(`quantity ${JSON.stringify(quantity)} is not a whole number of at least 1`);
  const amount = amountOf(form.amount.value);
  const participants = [
    // The inventory's own operation: it says how stock changes, and refuses with its own reasons.
    { service: 'inventory', operations: [{ op: 'reserve', key: { entityId: form.sku.value.trim() }, quantity: Number(quantity) }] },
    { service: form.service.value, operations: [{ op: 'add', key: { entityId: form.account.value.trim() }, field: 'balance', delta: `-${amount}`, min: 0 }] },
  ];
  // The card, when given: the payments resource authorizes it at prepare, captures it at commit.
  const card = form.card.value.trim(); const cents = form.cents.value.trim();
  if (card && state.services.payments) {
    if (!/^[1-9]\d*$/.test(cents)) throw new Error(`card amount ${JSON.stringify(cents)} is not a whole number of cents`);
    participants.push({ service: 'payments', operations: [{ op: 'charge', key: { entityId: `order-${Date.now().toString(36)}` }, card, amount: Number(cents) }] });
  }
  return { participants, holdMs: holdMsOf(form) };
}

function setUpForms() {
  const openForm = $('#open-form');
  openForm.addEventListener('submit', async (event) => {
    event.preventDefault();
    // The form as it is now: it may be filled in again while the subscription is acknowledged.
    const service = openForm.service.value; const entity = openForm.entity.value.trim();
    const body = { participants: [{ service, operations: [{ op: 'put', key: { entityId: entity }, data: { balance: Number(amountOf(openForm.balance.value)) }, ifNotExists: true }] }] };
    await watch(service, entity);
    submit(body, { label: `open ${entity}` });
  });

  const transferForm = $('#transfer-form');
  const transfer = async (times) => {
    const body = transferBody(transferForm);
    const label = `transfer ${transferForm.amount.value} ${transferForm.from.value} → ${transferForm.to.value}${heldLabel(transferForm)}`;
    await Promise.all([
      watch(transferForm.fromService.value, transferForm.from.value.trim()),
      watch(transferForm.toService.value, transferForm.to.value.trim()),
    ]);
    return Promise.all(Array.from({ length: times }, (_, i) => submit(body, { label: times > 1 ? `${label} (${i + 1} of ${times})` : label })));
  };
  transferForm.addEventListener('submit', (event) => { event.preventDefault(); transfer(1); });
  $('#transfer-twice').addEventListener('click', () => { if (transferForm.reportValidity()) transfer(2); });

  const orderForm = $('#order-form');
  orderForm.addEventListener('submit', async (event) => {
    event.preventDefault();
    const body = orderBody(orderForm);
    const sku = orderForm.sku.value.trim(); const account = orderForm.account.value.trim();
    const card = orderForm.card.value.trim() && state.services.payments ? ` and ${orderForm.cents.value.trim()} cents on card ${orderForm.card.value.trim().slice(-4)}` : '';
    const label = `order ${orderForm.quantity.value.trim()} ${sku} for ${orderForm.amount.value.trim()} from ${account}${card}${heldLabel(orderForm)}`;
    await Promise.all([watch('inventory', sku), watch(orderForm.service.value, account)]);
    submit(body, { label });
  });

  const rawForm = $('#raw-form');
  rawForm.body.value = JSON.stringify({
    participants: [
      { service: 'service-a', operations: [{ op: 'add', key: { entityId: 'alice' }, field: 'balance', delta: -5, min: 0 }] },
      { service: 'service-b', operations: [{ op: 'add', key: { entityId: 'bob' }, field: 'balance', delta: 5 }] },
    ],
    timeoutMs: 3000,
  }, null, 2);
  rawForm.addEventListener('submit', async (event) => {
    event.preventDefault();
    const error = $('#raw-error');
    error.hidden = true;
    let parsed;
    try { parsed = JSON.parse(rawForm.body.value); } catch (e) {
      // Sent all the same: the API's 400 says what is wrong, which is what this form is for.
      error.textContent = `not JSON (${e.message}); sent as written`;
      error.hidden = false;
    }
    const watches = [];
    for (const part of (parsed && parsed.participants) || []) {
      for (const op of part.operations || []) {
        if (op && op.key && typeof op.key.entityId === 'string') watches.push(watch(part.service, op.key.entityId));
      }
    }
    const sent = rawForm.body.value; const key = rawForm.key.value.trim() || undefined;
    await Promise.all(watches);
    submit(sent, { key, label: 'raw' });
  });

  const watchForm = $('#watch-form');
  watchForm.addEventListener('submit', (event) => {
    event.preventDefault();
    watch(watchForm.service.value, watchForm.entity.value.trim());
    watchForm.entity.value = '';
  });
}

// ---- rendering -----------------------------------------------------------------------------

function renderValue(data) {
  if (data === null || data === undefined) return element('span', { class: 'muted', text: 'deleted' });
  const parts = Object.entries(data).map(([name, value]) =>
    element('span', { class: 'field' }, element('span', { class: 'muted', text: `${name} ` }),
      element('b', { class: `value-${name}`, text: typeof value === 'object' ? JSON.stringify(value) : String(value) })));
  return element('span', {}, ...parts);
}

function renderItems(changedTopic) {
  const root = $('#items');
  root.replaceChildren();
  for (const [service, table] of Object.entries(state.services)) {
    if (state.resources.includes(service)) continue;
    const rows = [...state.watched.entries()].filter(([, w]) => w.service === service);
    const body = element('tbody');
    for (const [topic, w] of rows) {
      const push = state.items.get(topic);
      const row = element('tr', { 'data-topic': topic, 'data-entity': w.entity, 'data-service': service });
      row.append(element('td', { class: 'entity', text: w.entity }));
      const value = element('td', { class: 'value' });
      // A commit too large for a WebSocket message comes without its data (imagesOmitted).
      if (push && push.read && push.lockedBy) value.append(renderValue(push.data), element('span', { class: 'muted', text: ` (locked by ${short(push.lockedBy)})` }));
      else if (push && push.imagesOmitted) value.append(element('span', { class: 'muted', text: 'changed (too large to show live)' }));
      else if (push) value.append(renderValue(push.data));
      else if (state.refused.has(topic)) value.append(element('span', { class: 'muted', text: `not followed: ${state.refused.get(topic)}` }));
      else value.append(element('span', { class: 'muted', text: state.pending.has(topic) ? 'subscribing…' : 'no commit seen yet' }));
      row.append(value);
      row.append(element('td', { class: 'version', text: push ? `v${push.version}` : '' }));
      const last = !push ? '' : push.read ? 'as read when the page loaded' : `${short(push.transactionId)} · ${push.committedAt}`;
      row.append(element('td', { class: 'muted', text: last }));
      if (topic === changedTopic) row.classList.add('flash');
      body.append(row);
    }
    const empty = rows.length === 0 ? element('p', { class: 'muted', text: 'No item yet.' }) : '';
    root.append(element('div', { class: 'card service', 'data-service': service },
      element('h3', { text: `${service} ` }, element('span', { class: 'muted', text: table })),
      rows.length ? element('table', {}, element('thead', {}, element('tr', {},
        element('th', { text: 'item' }), element('th', { text: 'value' }), element('th', { text: 'version' }),
        element('th', { text: 'last commit' }))), body) : empty));
  }
}

function phases(record) {
  const votes = record.participants || [];
  const refused = votes.some((p) => p.vote === 'REFUSED' || p.code);
  const steps = ['prepare'];
  if (record.holdUntil && record.status !== 'PREPARED') steps.push('held');
  if (record.status === 'COMMITTING' || record.status === 'COMMITTED') steps.push('commit');
  if (record.status === 'ABORTING' || record.status === 'ABORTED') steps.push(refused ? 'abort (refused)' : 'abort');
  steps.push(record.status);
  return steps.join(' → ');
}

function renderTransactions() {
  const root = $('#transactions');
  root.replaceChildren();
  const entries = [...state.transactions.entries()].sort((a, b) => b[1].sentAt - a[1].sentAt);
  for (const [id, entry] of entries.slice(0, 50)) {
    const record = entry.record;
    const status = entry.sending ? 'SENDING' : entry.failure ? 'FAILED' : (record && record.status) || 'unknown';
    const item = element('li', { class: 'card transaction', 'data-status': status });
    if (record) item.setAttribute('data-tx', id);
    const head = element('div', { class: 'head' },
      element('span', { class: `badge ${status.toLowerCase()}`, text: status }),
      element('span', { class: 'label', text: entry.label || (entry.source === 'stream' ? 'seen on the stream' : '') }),
      element('code', { class: 'muted', text: record ? id : '' }),
      element('span', { class: 'muted', text: [entry.httpStatus ? `HTTP ${entry.httpStatus}` : '', entry.elapsedMs !== undefined ? `${entry.elapsedMs} ms` : ''].filter(Boolean).join(' · ') }));
    item.append(head);
    if (entry.failure) item.append(element('p', { class: 'error', text: entry.failure }));
    if (record) {
      item.append(element('p', { class: 'phases', text: phases(record) }));
      const rows = (record.participants || []).map((p) => element('tr', { 'data-service': p.service },
        element('td', { text: p.service }),
        element('td', { class: `vote ${(p.vote || '').toLowerCase()}`, text: p.vote || 'no vote' }),
        element('td', { class: 'code', text: [p.code, p.serviceCode].filter(Boolean).join(' ') }),
        element('td', { class: 'reason', text: p.reason || '' })));
      item.append(element('table', { class: 'votes' }, element('tbody', {}, ...rows)));
      if (record.reason) item.append(element('p', { class: 'reason', text: record.reason }));
    }
    root.append(item);
  }
  renderHeld();
}

async function renderPayments() {
  let listed;
  try { listed = await (await fetch('/local/payments')).json(); } catch { return; }
  const rows = (listed.authorizations || []).slice().reverse().slice(0, 20).map((a) => element('tr', { 'data-authorization': a.id, 'data-reference': a.reference, 'data-status': a.status },
    element('td', { text: a.id }), element('td', { text: a.reference }), element('td', { class: 'amount', text: `${a.amount} ${a.currency}` }),
    element('td', { class: 'muted', text: `…${a.card.slice(-4)}` }), element('td', { class: `status ${a.status}`, text: a.status })));
  $('#payments').replaceChildren(rows.length
    ? element('table', {}, element('thead', {}, element('tr', {}, ...['authorization', 'reference', 'amount', 'card', 'status'].map((t) => element('th', { text: t })))), element('tbody', {}, ...rows))
    : element('p', { class: 'muted', text: 'No authorization yet.' }));
}

async function renderLake() {
  let lake;
  try { lake = await (await fetch('/local/lake?files=5')).json(); } catch { return; }
  $('#lake-total').textContent = `${lake.total} file${lake.total === 1 ? '' : 's'}`;
  const root = $('#lake');
  root.replaceChildren(...lake.files.map((file) => {
    const lines = file.records.map((r) => typeof r === 'object'
      ? `${r.change} ${r.table} ${JSON.stringify(r.key)} v${r.version} ${JSON.stringify(r.data)}  (${short(r.transactionId)})`
      : String(r));
    return element('li', { class: 'card lake-file' },
      element('code', { text: file.key }),
      element('span', { class: 'muted', text: ` ${file.lines} record${file.lines === 1 ? '' : 's'}, ${file.bytes} bytes` }),
      element('pre', { text: lines.join('\n') }));
  }));
}

// The outcome events the bus received (the outcomes function's, one per request outcome, and the
// sweeper's age alerts), newest first: what a service listening on the bus hears.
async function renderEvents() {
  let listed;
  try { listed = await (await fetch('/local/events')).json(); } catch { return; }
  $('#events-total').textContent = `${listed.total} event${listed.total === 1 ? '' : 's'}`;
  $('#events').replaceChildren(...listed.events.map((e) => {
    const d = e.detail || {};
    const votes = (d.participants || []).map((p) => `${p.service}${p.vote ? ` ${p.vote}` : ''}`).join(', ');
    return element('li', { class: `event ${d.status || ''}` },
      element('span', { class: 'event-type', text: e['detail-type'] }), ' ',
      element('code', { text: d.outcomeId || '' }),
      element('span', { class: 'muted', text: ` ${e.time || ''}${votes ? ` · ${votes}` : ''}${d.reason ? ` · ${d.reason}` : ''}` }));
  }));
}

// ---- start ---------------------------------------------------------------------------------

// The services' items as they are now (the stack reads its tables: /local/items), each followed from
// here on; a commit push that arrived first is newer, and kept.
async function loadItems() {
  let listed;
  try { listed = await (await fetch(`/local/items?limit=${ITEMS_SHOWN}`)).json(); } catch { return; }
  for (const [service, read] of Object.entries(listed.services || {})) {
    if (!state.services[service]) continue;
    for (const item of read.items || []) {
      const entity = item.key && item.key.entityId;
      if (typeof entity !== 'string') continue;
      const topic = entityTopic(state.services[service], entity);
      state.watched.set(topic, { service, table: state.services[service], entity });
      if (!state.items.has(topic)) state.items.set(topic, { read: true, data: item.data, version: item.version, lockedBy: item.lockedBy });
    }
  }
}

// Per service, how many of its items the page follows from the start (each is a topic of this
// connection, and the WebSocket API caps those).
const ITEMS_SHOWN = 20;

async function start() {
  const stack = await (await fetch('/local/stack.json')).json();
  state.services = stack.services;
  state.resources = stack.resources || [];
  const names = Object.keys(state.services);
  for (const id of ['#open-service', '#from-service', '#to-service', '#watch-service']) {
    $(id).replaceChildren(...names.map((name) => element('option', { value: name, text: name })));
  }
  if (names.length > 1) $('#to-service').value = names[1];
  // Orders need the example inventory; they are paid from any other service's wallet.
  const wallets = names.filter((name) => name !== 'inventory');
  $('#order-form').hidden = !names.includes('inventory') || wallets.length === 0;
  const walletServices = wallets.filter((name) => !state.resources.includes(name));
  $('#order-service').replaceChildren(...walletServices.map((name) => element('option', { value: name, text: name })));
  $('#order-card').hidden = !state.services.payments;
  $('#payments-section').hidden = !state.services.payments;
  for (const id of ['#open-service', '#from-service', '#to-service', '#watch-service']) {
    for (const option of [...$(id).options]) if (state.resources.includes(option.value)) option.remove();
  }
  try {
    for (const [service, entity] of JSON.parse(localStorage.getItem('twopc.watched') || '[]')) {
      const table = state.services[service];
      if (table) state.watched.set(entityTopic(table, entity), { service, table, entity });
    }
  } catch { /* a stale list: start with none */ }
  $('#ws-url').textContent = stack.websocket;
  state.websocket = stack.websocket;
  state.auth = stack.auth || null;
  $('#sign-in').hidden = state.auth !== 'jwt';
  if (state.auth === 'jwt') {
    let user = { sub: 'admin', admin: true };
    try { user = JSON.parse(localStorage.getItem('twopc.user')) || user; } catch { /* the default user */ }
    $('#user-sub').value = user.sub;
    $('#user-admin').checked = !!user.admin;
    $('#user-operator').checked = !!user.operator;
    $('#sign-in').addEventListener('submit', (event) => {
      event.preventDefault();
      signIn($('#user-sub').value.trim(), $('#user-admin').checked, $('#user-operator').checked);
    });
    await signIn(user.sub, !!user.admin, !!user.operator);
  }
  await loadItems();
  setUpForms();
  renderItems();
  renderTransactions();
  connect(socketUrl());
  renderLake();
  setInterval(renderLake, 2000);
  renderEvents();
  setInterval(renderEvents, 2000);
  setUpOperators();
  checkOperator();
  setInterval(tickCountdowns, 250);
  if (state.services.payments) {
    renderPayments();
    setInterval(renderPayments, 2000);
  }
}

start();
