// The live page against a local stack that authorizes its callers (`twopc-local up --auth jwt`):
// it signs in as a chosen local user, and what that user may not do is refused with the policy's
// reason. tests/browser/run.sh starts that stack after the main test's and passes its address.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { launch } from './chromium.mjs';

const pageUrl = process.env.TWOPC_PAGE_URL;
const WAIT = 15_000;
const run = Date.now().toString(36);
const user = `carol-${run}`;
const other = `dave-${run}`;

let browser;
let page;

before(async () => {
  assert.ok(pageUrl, 'TWOPC_PAGE_URL is the running local stack\'s page (tests/browser/run.sh sets it)');
  browser = await launch();
  page = await browser.newPage({ viewport: { width: 1400, height: 1000 } });
  page.setDefaultTimeout(WAIT);
  await page.goto(pageUrl);
  await page.locator('#ws-status', { hasText: /^connected$/ }).waitFor();
});

after(async () => { await browser?.close(); });

const balance = (service, entity) =>
  page.locator(`#items tr[data-service="${service}"][data-entity="${entity}"] .value-balance`);

async function open(entity) {
  await page.fill('#open-entity', entity);
  await page.selectOption('#open-service', 'service-a');
  await page.fill('#open-balance', '100');
  await page.click('#open');
}

/// Waits until the page has asked the operators' API whether `sub` is an operator; what it answered.
async function operatorChecked(sub) {
  const section = page.locator(`#operators-section[data-checked-for="${sub}"]`);
  await section.waitFor({ state: 'attached' });
  return {
    operator: await section.getAttribute('data-operator'),
    visible: await section.isVisible(),
    buttons: await page.locator('#operators-section button[data-action]').count(),
  };
}

async function signIn(sub, { admin = false, operator = false } = {}) {
  await page.fill('#user-sub', sub);
  await page.setChecked('#user-admin', admin);
  await page.setChecked('#user-operator', operator);
  await page.click('#sign-in-button');
  const roles = [admin ? 'admin' : '', operator ? 'operator' : ''].filter(Boolean).join(', ');
  await page.locator('#user-status', { hasText: new RegExp(`^signed in as ${sub}${roles ? ` \\(${roles}\\)` : ''}$`) }).waitFor();
  await page.locator('#ws-status', { hasText: /^connected$/ }).waitFor();
}

test('the page signs in as the default admin, then as a chosen user', async () => {
  await page.locator('#sign-in').waitFor({ state: 'visible' });
  await page.locator('#user-status', { hasText: 'signed in as admin (admin)' }).waitFor();
  // An admin is not an operator: no Operators panel, no button of it.
  assert.deepEqual(await operatorChecked('admin'), { operator: 'false', visible: false, buttons: 0 });
  await signIn(user);
  assert.deepEqual(await operatorChecked(user), { operator: 'false', visible: false, buttons: 0 });
});

test('the user opens its own account and follows it live', async () => {
  await open(user);
  await balance('service-a', user).filter({ hasText: /^100$/ }).waitFor();
});

test('another user\'s account is refused with the policy\'s reason, nothing written', async () => {
  await open(other);
  const refused = page.locator('#transactions > li .error', { hasText: 'FORBIDDEN' });
  await refused.first().waitFor();
  assert.match(await refused.first().textContent(), new RegExp(`"${other}"`));
  assert.equal(await balance('service-a', other).count(), 0, 'no balance for an account never opened');
});

test('an operator sees the Operators panel and aborts a held transaction; a user signed in after sees none of it', async () => {
  const olga = `olga-${run}`;
  await signIn(olga, { operator: true });
  assert.deepEqual(await operatorChecked(olga), { operator: 'true', visible: true, buttons: 0 });
  // Her own accounts, then a transfer between them held for a decision (a user holds only its own items).
  for (const [service, amount] of [['service-a', '50'], ['service-b', '0']]) {
    await page.fill('#open-entity', olga);
    await page.selectOption('#open-service', service);
    await page.fill('#open-balance', amount);
    await page.click('#open');
    await balance(service, olga).filter({ hasText: new RegExp(`^${amount}$`) }).waitFor();
  }
  await page.fill('#from-entity', olga);
  await page.selectOption('#from-service', 'service-a');
  await page.fill('#to-entity', olga);
  await page.selectOption('#to-service', 'service-b');
  await page.fill('#amount', '5');
  await page.check('#transfer-hold');
  await page.click('#transfer');
  const placed = page.locator('#held > li[data-status="PREPARED"]').first();
  await placed.waitFor();
  const id = await placed.getAttribute('data-tx');
  const held = page.locator(`#held > li[data-tx="${id}"]`);
  await page.click('#operators-refresh');
  const row = page.locator(`#operator-open tbody tr[data-tx="${id}"]`);
  await row.locator('button.operator-show').click();
  const detail = page.locator(`#operator-detail[data-tx="${id}"]`);
  await detail.locator('table.locks').waitFor();
  await detail.locator('button.operator-abort').click();
  await page.locator(`#operator-answer[data-tx="${id}"][data-action="abort"][data-status="ABORTED"]`).waitFor();
  await row.waitFor({ state: 'detached' });
  await held.locator('.outcome', { hasText: /→ ABORTED$/ }).waitFor();
  // Its audit names her (her token's principal).
  const audit = detail.locator('table.audit-log tbody tr').first();
  await audit.waitFor();
  assert.match(await audit.locator('td').nth(1).textContent(), new RegExp(`^jwt:.*#${olga}$`));

  // Whoever signs in next and is not an operator has no panel, and no button of it left in the page.
  await signIn(user);
  assert.deepEqual(await operatorChecked(user), { operator: 'false', visible: false, buttons: 0 });
  assert.equal(await page.locator('#operator-detail tr').count(), 0);
});
