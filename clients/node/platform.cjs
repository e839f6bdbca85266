'use strict';
// Which per-platform package carries this machine's native pieces (the addon `idemgate.node` and
// the `idemgate` binary), the @swc/biome pattern: the `idemgate` package names every platform
// package as an optional dependency, and npm installs only the one whose `os`, `cpu` and `libc`
// match. Shared by native.cjs (the addon) and bin/idemgate.cjs (the binary), so both name the
// same package in the same words when it is missing.
//
// Only packages published under the `@idemgate` scope by the idemgate project may provide them;
// IDEMGATE_NODE_ADDON and IDEMGATE_BIN name files you built yourself.

const path = require('node:path');

/** Where a checkout's own build of the addon goes, beside this file (install.cjs or
 * scripts/test-node puts it there; native.cjs loads it before any platform package). */
const LOCAL_ADDON = path.join(__dirname, `idemgate.${process.platform}-${process.arch}.node`);

/** The platforms `scripts/release` builds packages for (scripts/npm-packages.mjs writes them). */
const PLATFORMS = [
  'linux-x64-gnu',
  'linux-x64-musl',
  'linux-arm64-gnu',
  'linux-arm64-musl',
  'win32-x64',
  'darwin-x64',
  'darwin-arm64',
];

/** `glibc` or `musl` on Linux (what npm's `libc` field matches), else null. */
function libc() {
  if (process.platform !== 'linux') return null;
  // Node reports the glibc it runs on; a musl build of Node (Alpine) has no such field.
  const header = process.report?.getReport?.().header;
  return header?.glibcVersionRuntime ? 'glibc' : 'musl';
}

/** This machine's platform id: `linux-x64-gnu`, `linux-arm64-musl`, `darwin-arm64`, … */
function platformId() {
  const base = `${process.platform}-${process.arch}`;
  const c = libc();
  return c === null ? base : `${base}-${c === 'glibc' ? 'gnu' : 'musl'}`;
}

/** The package for this machine, and whether one is built for it at all. */
function platformPackage() {
  const id = platformId();
  return { id, name: `@idemgate/${id}`, supported: PLATFORMS.includes(id) };
}

/**
 * Why the platform package could not be found, and what to do: the words both the addon and the
 * binary use.
 */
function missingPackage(what, envVar) {
  const { id, name, supported } = platformPackage();
  const own = `or set ${envVar} to ${what} you built (from a checkout of idemgate: \`npm install\` in clients/node with cargo on PATH builds the addon; \`cargo install --locked --path crates/idemgate-cli\` the binary)`;
  if (!supported) {
    return `idemgate: no ${what} for ${id}: packages are built for ${PLATFORMS.join(', ')}; ${own}`;
  }
  return (
    `idemgate: no ${what} for ${id}: the package ${name} is not installed. npm installs it as an ` +
    'optional dependency of idemgate; reinstall without --omit=optional (or --no-optional), and ' +
    `with no lock file made on another platform, e.g. \`npm install ${name}\` beside idemgate; ${own}`
  );
}

/** The binary's path inside a platform package: `bin/idemgate`, `bin/idemgate.exe` on Windows. */
function binaryPath(id = platformId()) {
  return id.startsWith('win32-') ? 'bin/idemgate.exe' : 'bin/idemgate';
}

module.exports = { LOCAL_ADDON, PLATFORMS, libc, platformId, platformPackage, missingPackage, binaryPath };
