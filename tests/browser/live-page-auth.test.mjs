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

test('the page signs in as the default admin, then as a chosen user', async () => {
  await page.locator('#sign-in').waitFor({ state: 'visible' });
  await page.locator('#user-status', { hasText: 'signed in as admin (admin)' }).waitFor();
  await page.fill('#user-sub', user);
  await page.uncheck('#user-admin');
  await page.click('#sign-in-button');
  await page.locator('#user-status', { hasText: new RegExp(`^signed in as ${user}$`) }).waitFor();
  await page.locator('#ws-status', { hasText: /^connected$/ }).waitFor();
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
