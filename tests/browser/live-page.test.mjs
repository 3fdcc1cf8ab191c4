// The live page in a real browser: Debian's Chromium, driven by Playwright, against a running local
// stack (tests/browser/run.sh starts one on free ports and passes its address in TWOPC_PAGE_URL).
// Every wait polls what the user sees on the page; nothing sleeps in place of a condition.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdirSync } from 'node:fs';
import { launch } from './chromium.mjs';

const pageUrl = process.env.TWOPC_PAGE_URL;
const screenshots = process.env.TWOPC_SCREENSHOTS || '../../target/browser';
const WAIT = 15_000;

// Names of this run's own, so a kept data folder or a second run never meets them.
const run = Date.now().toString(36);
const alice = `alice-${run}`;
const bob = `bob-${run}`;

let browser;
let page;
const consoleErrors = [];

before(async () => {
  assert.ok(pageUrl, 'TWOPC_PAGE_URL is the running local stack\'s page (tests/browser/run.sh sets it)');
  browser = await launch();
  page = await browser.newPage({ viewport: { width: 1400, height: 1000 } });
  page.on('console', (message) => { if (message.type() === 'error') consoleErrors.push(message.text()); });
  page.on('pageerror', (error) => consoleErrors.push(String(error)));
  page.setDefaultTimeout(WAIT);
  await page.goto(pageUrl);
  await page.locator('#ws-status', { hasText: /^connected$/ }).waitFor();
  // Set once: had the page reloaded, this would be gone.
  await page.evaluate(() => { window.sameDocument = true; });
});

after(async () => {
  if (page) {
    mkdirSync(screenshots, { recursive: true });
    await page.screenshot({ path: `${screenshots}/live-page.png`, fullPage: true }).catch(() => {});
  }
  await browser?.close();
});

const item = (service, entity) => page.locator(`#items tr[data-service="${service}"][data-entity="${entity}"]`);
const balance = (service, entity) => item(service, entity).locator('.value-balance');

async function transfer(from, to, amount, button = '#transfer') {
  await page.fill('#from-entity', from);
  await page.selectOption('#from-service', 'service-a');
  await page.fill('#to-entity', to);
  await page.selectOption('#to-service', 'service-b');
  await page.fill('#amount', String(amount));
  await page.click(button);
}

/// The transaction entries the page shows, newest first: status, label and votes.
async function transactions() {
  return page.locator('#transactions > li').evaluateAll((items) => items.map((li) => ({
    id: li.getAttribute('data-tx'),
    status: li.getAttribute('data-status'),
    label: li.querySelector('.label')?.textContent,
    phases: li.querySelector('.phases')?.textContent,
    votes: [...li.querySelectorAll('.votes tr')].map((tr) => ({
      service: tr.getAttribute('data-service'),
      vote: tr.querySelector('.vote')?.textContent,
      code: tr.querySelector('.code')?.textContent,
      reason: tr.querySelector('.reason')?.textContent,
    })),
  })));
}

async function waitForTransaction(matches, what) {
  const deadline = Date.now() + WAIT;
  for (;;) {
    const found = (await transactions()).find(matches);
    if (found) return found;
    if (Date.now() > deadline) assert.fail(`the page shows no transaction ${what}: ${JSON.stringify(await transactions(), null, 1)}`);
    await page.waitForTimeout(50);
  }
}

test('the example items show from the start, read from the tables, before any commit', async () => {
  // `twopc-local up` puts the example SKUs and wallets in a new stack; the page reads each service's
  // items when it loads (the stack's /local/items), so an item that exists has its value at once.
  await item('inventory', 'lamp').locator('.value-stock').filter({ hasText: /^10$/ }).waitFor();
  await item('inventory', 'desk').locator('.value-active').filter({ hasText: /^false$/ }).waitFor();
  await balance('service-a', 'alice').filter({ hasText: /^100$/ }).waitFor();
  await balance('service-b', 'bob').filter({ hasText: /^20$/ }).waitFor();
  assert.equal(await page.locator('#order-form').isVisible(), true, 'the order form, since the stack has the inventory');
});

test('opening two accounts shows their balances live', async () => {
  await page.fill('#open-entity', alice);
  await page.selectOption('#open-service', 'service-a');
  await page.fill('#open-balance', '100');
  await page.click('#open');
  await page.fill('#open-entity', bob);
  await page.selectOption('#open-service', 'service-b');
  await page.fill('#open-balance', '0');
  await page.click('#open');
  await balance('service-a', alice).filter({ hasText: /^100$/ }).waitFor();
  await balance('service-b', bob).filter({ hasText: /^0$/ }).waitFor();
});

test('a transfer changes both balances without a reload', async () => {
  await transfer(alice, bob, 30);
  await balance('service-a', alice).filter({ hasText: /^70$/ }).waitFor();
  await balance('service-b', bob).filter({ hasText: /^30$/ }).waitFor();
  assert.equal(await page.evaluate(() => window.sameDocument), true, 'the page was not reloaded');
  const shown = await waitForTransaction((t) => t.label === `transfer 30 ${alice} → ${bob}` && t.status === 'COMMITTED', 'committed');
  assert.match(shown.phases, /prepare → commit → COMMITTED/);
  assert.deepEqual(shown.votes.map((v) => [v.service, v.vote]), [['service-a', 'PREPARED'], ['service-b', 'PREPARED']]);
});

test('a refused transfer shows its guard\'s reason and changes nothing', async () => {
  await transfer(alice, bob, 1000);
  const refused = await waitForTransaction((t) => t.label === `transfer 1000 ${alice} → ${bob}` && t.status === 'ABORTED', 'aborted');
  const vote = refused.votes.find((v) => v.service === 'service-a');
  assert.equal(vote.vote, 'REFUSED');
  assert.equal(vote.code, 'CONDITION_FAILED');
  assert.match(vote.reason, /balance/, 'the reason names the guarded field');
  assert.match(refused.phases, /abort \(refused\) → ABORTED/);
  // Nothing was applied: the next commit the page sees is still from 70 and 30.
  assert.equal(await balance('service-a', alice).textContent(), '70');
  assert.equal(await balance('service-b', bob).textContent(), '30');
});

test('two transfers at once on the same accounts both commit: the one refused for contention is retried with its age', async () => {
  // Since issue 35 the coordinator retries a transfer refused by the other's lock (keeping its age), so
  // both of a pair commit however they overlap. Each pair moves 1 from alice to bob twice.
  const pairs = 3;
  for (let pair = 0; pair < pairs; pair++) {
    const before = (await transactions()).length;
    await transfer(alice, bob, 1, '#transfer-twice');
    await page.waitForFunction((count) => {
      const items = [...document.querySelectorAll('#transactions > li')];
      return items.length >= count && items.slice(0, 2).every((li) => ['COMMITTED', 'ABORTED'].includes(li.dataset.status));
    }, before + 2);
    const both = (await transactions()).slice(0, 2);
    assert.deepEqual(both.map((t) => t.status), ['COMMITTED', 'COMMITTED'], JSON.stringify(both));
  }
  // Every transfer that committed moved 1, and the balances the pushes show still add up to 100.
  const committed = (await transactions()).filter((t) => t.label?.startsWith(`transfer 1 ${alice}`) && t.status === 'COMMITTED').length;
  await balance('service-a', alice).filter({ hasText: new RegExp(`^${70 - committed}$`) }).waitFor();
  await balance('service-b', bob).filter({ hasText: new RegExp(`^${30 + committed}$`) }).waitFor();
});

test('the lake shows the committed changes, and nothing of the refused ones', async () => {
  await page.locator('#lake pre', { hasText: alice }).first().waitFor();
  const lake = await page.locator('#lake').textContent();
  assert.ok(!lake.includes('1000'), 'no line of the refused transfer');
});

test('the outcome events show each outcome, a refusal with its reason', async () => {
  // The outcomes function (the transactions stream's second reader) sends them to the local bus, which
  // keeps them under .local/events/; the page lists the newest.
  await page.locator('#events li', { hasText: 'Transaction Committed' }).first().waitFor();
  await page.locator('#events li', { hasText: 'Transaction Aborted' }).filter({ hasText: /balance/ }).first().waitFor();
  assert.match(await page.locator('#events-total').textContent(), /^\d+ events?$/);
});

async function order(sku, quantity, account, amount, card = '', cents = '') {
  await page.fill('#order-sku', sku);
  await page.fill('#order-quantity', String(quantity));
  await page.selectOption('#order-service', 'service-a');
  await page.fill('#order-account', account);
  await page.fill('#order-amount', String(amount));
  await page.fill('#order-card-number', card);
  await page.fill('#order-cents', cents);
  await page.click('#order');
  return `order ${quantity} ${sku} for ${amount} from ${account}${card ? ` and ${cents} cents on card ${card.slice(-4)}` : ''}`;
}

test('an order reserves stock with the inventory\'s own operation and debits the wallet, together or not at all', async () => {
  const carol = `carol-${run}`;
  await page.fill('#open-entity', carol);
  await page.selectOption('#open-service', 'service-a');
  await page.fill('#open-balance', '50');
  await page.click('#open');
  await balance('service-a', carol).filter({ hasText: /^50$/ }).waitFor();
  const lamp = item('inventory', 'lamp');

  let label = await order('lamp', 2, carol, 20);
  const placed = await waitForTransaction((t) => t.label === label && t.status === 'COMMITTED', 'committed');
  assert.deepEqual(placed.votes.map((v) => [v.service, v.vote]), [['inventory', 'PREPARED'], ['service-a', 'PREPARED']]);
  await lamp.locator('.value-stock').filter({ hasText: /^8$/ }).waitFor();
  await lamp.locator('.value-reserved').filter({ hasText: /^2$/ }).waitFor();
  await balance('service-a', carol).filter({ hasText: /^30$/ }).waitFor();

  // More than in stock: the inventory refuses with the numbers; the wallet is not debited.
  label = await order('lamp', 100, carol, 1);
  let refused = await waitForTransaction((t) => t.label === label && t.status === 'ABORTED', 'aborted');
  let vote = refused.votes.find((v) => v.service === 'inventory');
  assert.equal(vote.code, 'CONDITION_FAILED');
  assert.match(vote.reason, /stock 8 - 100 = -92 is below zero/);

  // An inactive SKU: the inventory's rule, with its own code beside RULE.
  label = await order('desk', 1, carol, 1);
  refused = await waitForTransaction((t) => t.label === label && t.status === 'ABORTED', 'aborted');
  vote = refused.votes.find((v) => v.service === 'inventory');
  assert.equal(vote.code, 'RULE INACTIVE');
  assert.equal(await lamp.locator('.value-stock').textContent(), '8');
  assert.equal(await balance('service-a', carol).textContent(), '30');

  // With a card: the payments resource authorizes at prepare and captures at commit, at all three or none.
  label = await order('lamp', 1, carol, 5, '4242424242424242', '1500');
  const paid = await waitForTransaction((t) => t.label === label && t.status === 'COMMITTED', 'committed');
  assert.deepEqual(paid.votes.map((v) => [v.service, v.vote]), [['inventory', 'PREPARED'], ['service-a', 'PREPARED'], ['payments', 'PREPARED']]);
  await lamp.locator('.value-stock').filter({ hasText: /^7$/ }).waitFor();
  await balance('service-a', carol).filter({ hasText: /^25$/ }).waitFor();
  await page.locator('#payments tr[data-status="captured"] td.amount', { hasText: '1500 EUR' }).waitFor();
  label = await order('lamp', 1, carol, 5, '4000000000000002', '900');
  refused = await waitForTransaction((t) => t.label === label && t.status === 'ABORTED', 'aborted');
  vote = refused.votes.find((v) => v.service === 'payments');
  assert.equal(vote.code, 'RULE CARD_DECLINED');
  assert.equal(await lamp.locator('.value-stock').textContent(), '7');
  assert.equal(await balance('service-a', carol).textContent(), '25');
  assert.equal(await page.locator('#payments tr[data-status="authorized"]').count(), 0, 'nothing held');
});

/// A held transaction's entry under Held, found by its label.
const heldEntry = (label) => page.locator('#held > li').filter({ has: page.locator('.label', { hasText: label }) });

test('held transactions: placed from the page, counted down, approved, rejected, and one that expires', async () => {
  const dave = `dave-${run}`;
  const erin = `erin-${run}`;
  for (const [entity, service, amount] of [[dave, 'service-a', '50'], [erin, 'service-b', '0']]) {
    await page.fill('#open-entity', entity);
    await page.selectOption('#open-service', service);
    await page.fill('#open-balance', amount);
    await page.click('#open');
  }
  await balance('service-a', dave).filter({ hasText: /^50$/ }).waitFor();
  await balance('service-b', erin).filter({ hasText: /^0$/ }).waitFor();

  // Decide later, 60 s: answered 202 PREPARED, listed under Held with its holdUntil counting down.
  await page.check('#transfer-hold');
  await page.fill('#transfer-hold-seconds', '60');
  await transfer(dave, erin, 5);
  let label = `transfer 5 ${dave} → ${erin} (held 60 s)`;
  const approved = heldEntry(label);
  const countdown = approved.locator('.countdown');
  await countdown.waitFor();
  assert.equal(await approved.getAttribute('data-status'), 'PREPARED');
  const first = await countdown.textContent();
  const left = first.match(/(\d+):(\d\d) left$/);
  assert.ok(left, `a countdown: ${first}`);
  const seconds = Number(left[1]) * 60 + Number(left[2]);
  assert.ok(seconds > 45 && seconds <= 60, `about 60 s left: ${first}`);
  const id = await approved.getAttribute('data-tx');
  await page.waitForFunction(([selector, text]) => {
    const node = document.querySelector(selector);
    return node && node.textContent !== text;
  }, [`#held li[data-tx="${id}"] .countdown`, first]);
  const shown = await waitForTransaction((t) => t.id === id && t.status === 'PREPARED', 'held');
  assert.match(shown.phases, /^prepare → PREPARED$/);
  assert.equal((await transactions()).find((t) => t.id === id).label, label);

  // Its locks stay: a plain transfer from the same account is refused, naming the holder.
  await page.uncheck('#transfer-hold');
  await transfer(dave, erin, 1);
  const blocked = await waitForTransaction((t) => t.label === `transfer 1 ${dave} → ${erin}` && t.status === 'ABORTED', 'refused by the lock');
  const lockVote = blocked.votes.find((v) => v.service === 'service-a');
  assert.equal(lockVote.code, 'CONFLICT');
  assert.ok(lockVote.reason.includes(id), `the reason names the held transaction: ${lockVote.reason}`);

  // Approve: committed, both balances change.
  await approved.locator('button.approve').click();
  await approved.locator('.outcome', { hasText: /^approved → COMMITTED \(HTTP 200\)$/ }).waitFor();
  await balance('service-a', dave).filter({ hasText: /^45$/ }).waitFor();
  await balance('service-b', erin).filter({ hasText: /^5$/ }).waitFor();
  const committed = await waitForTransaction((t) => t.id === id && t.status === 'COMMITTED', 'committed');
  assert.match(committed.phases, /prepare → held → commit → COMMITTED/);

  // Reject: aborted, nothing applied.
  await page.check('#transfer-hold');
  await transfer(dave, erin, 7);
  label = `transfer 7 ${dave} → ${erin} (held 60 s)`;
  const rejected = heldEntry(label);
  await rejected.locator('.countdown').waitFor();
  await rejected.locator('button.reject').click();
  await rejected.locator('.outcome', { hasText: /^rejected → ABORTED \(HTTP 200\)$/ }).waitFor();
  const rejectedId = await rejected.getAttribute('data-tx');
  const aborted = await waitForTransaction((t) => t.id === rejectedId && t.status === 'ABORTED', 'aborted');
  assert.match(aborted.phases, /prepare → held → abort → ABORTED/);

  // Nobody decides within 1 s: once holdUntil has passed the sweeper aborts it, and the page shows it expired.
  await page.fill('#transfer-hold-seconds', '1');
  await transfer(dave, erin, 3);
  const expired = heldEntry(`transfer 3 ${dave} → ${erin} (held 1 s)`);
  await expired.locator('.outcome', { hasText: /^expired → ABORTED$/ }).waitFor();
  assert.match(await expired.locator('.reason').textContent(), /hold expired/);
  await page.uncheck('#transfer-hold');
  await page.fill('#transfer-hold-seconds', '60');

  // Neither the rejected nor the expired one changed anything.
  assert.equal(await balance('service-a', dave).textContent(), '45');
  assert.equal(await balance('service-b', erin).textContent(), '5');
});

/// A transaction's row in the Operators panel's list of open ones.
const openRow = (id) => page.locator(`#operator-open tbody tr[data-tx="${id}"]`);

test('the Operators panel: a held transaction listed, its detail with its locks, aborted by an operator', async () => {
  // Without --auth every caller is an operator: the panel shows, and the page asked the API whether.
  await page.locator('#operators-section').waitFor({ state: 'visible' });
  const frank = `frank-${run}`;
  const grace = `grace-${run}`;
  for (const [entity, service, amount] of [[frank, 'service-a', '50'], [grace, 'service-b', '0']]) {
    await page.fill('#open-entity', entity);
    await page.selectOption('#open-service', service);
    await page.fill('#open-balance', amount);
    await page.click('#open');
  }
  await balance('service-a', frank).filter({ hasText: /^50$/ }).waitFor();
  await balance('service-b', grace).filter({ hasText: /^0$/ }).waitFor();

  // Held for 60 s: PREPARED, its locks kept; the panel lists it (re-read every few seconds, or now).
  await page.check('#transfer-hold');
  await page.fill('#transfer-hold-seconds', '60');
  await transfer(frank, grace, 4);
  await page.uncheck('#transfer-hold');
  const held = heldEntry(`transfer 4 ${frank} → ${grace} (held 60 s)`);
  await held.locator('.countdown').waitFor();
  const id = await held.getAttribute('data-tx');
  await page.click('#operators-refresh');
  const row = openRow(id);
  await row.waitFor();
  assert.equal(await row.getAttribute('data-status'), 'PREPARED');
  assert.deepEqual(await row.locator('.participant').evaluateAll((spans) => spans.map((s) => s.textContent)),
    ['service-a PREPARED', 'service-b PREPARED']);
  assert.match(await row.locator('td.age').textContent(), /^\d+ s$/);

  // Its detail: participants and votes, the chain, and the locks its items hold now.
  await row.locator('button.operator-show').click();
  const detail = page.locator(`#operator-detail[data-tx="${id}"]`);
  await detail.locator('table.locks').waitFor();
  assert.equal(await detail.getAttribute('data-status'), 'PREPARED');
  assert.deepEqual(await detail.locator('table.participants tbody tr').evaluateAll((rows) => rows.map((r) => [r.dataset.service, r.querySelector('.vote').textContent])),
    [['service-a', 'PREPARED'], ['service-b', 'PREPARED']]);
  const locks = await detail.locator('table.locks tbody tr').evaluateAll((rows) => rows.map((r) => [r.dataset.service, r.querySelector('.key').textContent, r.dataset.lockedByIt]));
  assert.deepEqual(locks, [['service-a', JSON.stringify({ entityId: frank }), 'true'], ['service-b', JSON.stringify({ entityId: grace }), 'true']]);
  assert.equal(await detail.locator('.chain code').first().textContent(), id);
  assert.match(await detail.locator('[data-field="holdUntil"] td').textContent(), /^\d{4}-\d\d-\d\dT.*\(in /);
  await detail.locator('p.audit-log', { hasText: 'no operator action yet' }).waitFor();

  // Retry of an undecided one: refused, as the API says (409 NOT_DECIDED); nothing changes.
  await detail.locator('button.operator-retry').click();
  const answer = page.locator(`#operator-answer[data-tx="${id}"]`);
  await page.locator(`#operator-answer[data-tx="${id}"][data-action="retry"]`).waitFor();
  assert.equal(await answer.getAttribute('data-code'), 'NOT_DECIDED');
  assert.equal(await answer.getAttribute('data-http'), '409');

  // Abort: ABORTED, out of the open list, its locks released, the audit says who; the page's Held
  // entry follows it (its tx: topic), and nothing was applied.
  await row.locator('button.operator-abort').click();
  await page.locator(`#operator-answer[data-tx="${id}"][data-action="abort"][data-status="ABORTED"]`).waitFor();
  assert.match(await answer.textContent(), new RegExp(`^abort ${id} → ABORTED \\(HTTP 200\\)$`));
  await row.waitFor({ state: 'detached' });
  await page.locator(`#operator-detail[data-tx="${id}"][data-status="ABORTED"]`).waitFor();
  await detail.locator('table.audit-log tbody tr').first().waitFor();
  assert.deepEqual(await detail.locator('table.audit-log tbody tr').first().evaluate((r) => [...r.cells].slice(2).map((c) => c.textContent)), ['abort', 'ABORTED']);
  assert.deepEqual(await detail.locator('table.locks tbody tr').evaluateAll((rows) => rows.map((r) => r.dataset.lockedByIt)), ['false', 'false']);
  await held.locator('.outcome', { hasText: /→ ABORTED$/ }).waitFor();
  assert.match(await held.locator('.reason').textContent(), /aborted by an operator/);
  await waitForTransaction((t) => t.id === id && t.status === 'ABORTED', 'aborted by the operator');
  assert.equal(await balance('service-a', frank).textContent(), '50');
  assert.equal(await balance('service-b', grace).textContent(), '0');

  // Abort again: the same end, 200 again, and audited again.
  await detail.locator('button.operator-abort').click();
  await page.waitForFunction(() => document.querySelectorAll('#operator-detail table.audit-log tbody tr').length === 2);
  assert.equal(await answer.getAttribute('data-http'), '200');
  assert.equal(await answer.getAttribute('data-status'), 'ABORTED');
  // The stuck view answers (with the default lockAgeMs, 60000).
  await page.locator('#operator-stuck-count', { hasText: /locks expired at least 1 min ago$/ }).waitFor();
});

test('the REST API answers a page of another origin (CORS preflight in a real browser)', async () => {
  // http://localhost:PORT is another origin than http://127.0.0.1:PORT, in the same (loopback)
  // address space, so the browser applies CORS and nothing else.
  const other = await browser.newPage();
  const otherOrigin = pageUrl.replace('//127.0.0.1:', '//localhost:');
  assert.notEqual(otherOrigin, pageUrl);
  await other.goto(`${otherOrigin}local/stack.json`);
  const answer = await other.evaluate(async (api) => {
    // JSON and Idempotency-Key make this a request the browser preflights.
    const response = await fetch(`${api}transactions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'idempotency-key': `cors-${Date.now()}` },
      body: JSON.stringify({ participants: [{ service: 'service-a', operations: [{ op: 'check', key: { entityId: 'nobody' }, exists: false }] }] }),
    });
    return { status: response.status, body: await response.json() };
  }, pageUrl);
  await other.close();
  assert.equal(answer.status, 200, JSON.stringify(answer));
  assert.equal(answer.body.status, 'COMMITTED');
});

test('the page logged no error', () => {
  // Chromium logs every answer of 400 or more as a failed load, the 409 of an aborted transaction too.
  const errors = consoleErrors.filter((text) => !/status of 409 \(Conflict\)/.test(text));
  assert.deepEqual(errors, []);
});
