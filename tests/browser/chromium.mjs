// Debian's Chromium for the browser tests, launched as every test file needs it.
import { chromium } from 'playwright-core';

export const executablePath = process.env.CHROMIUM || '/usr/bin/chromium';

/// Headless, with the flags that keep Chromium off the network it would call home on (closed here),
/// and --no-sandbox because CI runs as root.
export function launch() {
  return chromium.launch({
    executablePath,
    headless: true,
    args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking',
      '--disable-component-update', '--disable-sync', '--disable-dev-shm-usage'],
  });
}
