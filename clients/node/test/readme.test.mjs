// The README's example, run as written (its first ```js block, as a module of this package),
// and its same-action table, the suite's.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { readFileSync, writeFileSync, rmSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { within } from './helpers.mjs';

test("the README's example prints what its comments say", async () => {
  const readme = readFileSync(new URL('../README.md', import.meta.url), 'utf8');
  const example = readme.match(/```js\n([\s\S]*?)```/)[1];
  // Beside the package, so that `import 'idemgate'` resolves to it (a package imports itself by name).
  const file = fileURLToPath(new URL(`./readme-example-${process.pid}.mjs`, import.meta.url));
  writeFileSync(file, example);
  try {
    const { stdout } = await within(promisify(execFile)(process.execPath, [file]), 'the example to run');
    const lines = stdout.trim().split('\n');
    assert.deepEqual(lines, [
      "{ chargeId: 'ch-order-1', amount: 12 }",
      "{ chargeId: 'ch-order-1', amount: 12 }",
      'true true 1',
      'the bank timed out',
      'true',
    ]);
  } finally {
    rmSync(file, { force: true });
  }
});

test("the README's same-action table is the suite's (test/same-action.mjs)", async () => {
  const { DOORS, table } = await import('./same-action.mjs');
  const readme = readFileSync(new URL('../README.md', import.meta.url), 'utf8');
  const shown = readme.match(/<!-- same-action table:[^\n]*-->\n([\s\S]*?)\n<!-- end of the same-action table -->/);
  assert.ok(shown, 'README.md has the same-action table between its markers');
  assert.equal(shown[1], table(Object.values(DOORS)));
});
