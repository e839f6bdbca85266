#!/usr/bin/env node
'use strict';
// `npx idemgate …`: runs the `idemgate` binary of this platform, carried by the platform package
// `@idemgate/<platform>-<arch>[-<libc>]` (platform.cjs: npm installs only the one whose `os`,
// `cpu` and `libc` match). IDEMGATE_BIN names another binary.
const { spawnSync } = require('node:child_process');
const { platformPackage, missingPackage, binaryPath } = require('../platform.cjs');

function binary() {
  if (process.env.IDEMGATE_BIN) return process.env.IDEMGATE_BIN;
  try {
    return require.resolve(`${platformPackage().name}/${binaryPath()}`);
  } catch {
    console.error(missingPackage('idemgate binary', 'IDEMGATE_BIN'));
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
