// The README's example, run as written: its first ```js block, as a module of this package.
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
