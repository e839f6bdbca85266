#!/usr/bin/env node
'use strict';
// `npx idemgate …`: runs the `idemgate` binary of this platform, carried by the optional
// dependency `@idemgate/cli-<platform>-<arch>` (the esbuild/biome pattern: npm installs only the
// one whose `os` and `cpu` match). IDEMGATE_BIN names another binary.
const { spawnSync } = require('node:child_process');

function binary() {
  if (process.env.IDEMGATE_BIN) return process.env.IDEMGATE_BIN;
  const pkg = `@idemgate/cli-${process.platform}-${process.arch}`;
  try {
    return require.resolve(`${pkg}/bin/idemgate`);
  } catch {
    console.error(
      `idemgate: no binary for ${process.platform}-${process.arch}: the package ${pkg} is not installed ` +
        '(npm skips optional dependencies with --no-optional, or none is published for this platform); ' +
        'set IDEMGATE_BIN to an idemgate binary, or install it with `cargo install --path crates/idemgate-cli`',
    );
    process.exit(127);
  }
}

const r = spawnSync(binary(), process.argv.slice(2), { stdio: 'inherit' });
if (r.error) {
  console.error(`idemgate: cannot run ${r.error.path ?? 'the binary'}: ${r.error.message}`);
  process.exit(127);
}
// Dies of the signal its child died of, so a caller sees the same ending.
if (r.signal) process.kill(process.pid, r.signal);
process.exit(r.status ?? 1);
