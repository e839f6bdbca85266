'use strict';
// The install script of this folder in a checkout of idemgate (`npm install ./clients/node`, or
// `npm ci` here): a checkout carries no native addon until one is built, so this finds one where
// native.cjs looks, or builds it with cargo, or fails saying exactly what to run. The published
// package has no install script: its addon comes in the platform package (scripts/npm-packages.mjs
// leaves this file and the script out).
//
//   IDEMGATE_BUILD_PROFILE  the cargo profile to build with (default release; `dev` is quicker)
//   IDEMGATE_SOURCE         the checkout to build from (default: the one this folder is in)
const { spawnSync } = require('node:child_process');
const fs = require('node:fs');
const path = require('node:path');
const { LOCAL_ADDON: local, platformPackage } = require('./platform.cjs');

function found() {
  if (process.env.IDEMGATE_NODE_ADDON || fs.existsSync(local)) return true;
  try {
    require.resolve(platformPackage().name);
    return true;
  } catch {
    return false;
  }
}

function fail(message) {
  console.error(`idemgate: ${message}`);
  process.exit(1);
}

if (found()) process.exit(0);

const root = process.env.IDEMGATE_SOURCE || path.resolve(__dirname, '..', '..');
if (!fs.existsSync(path.join(root, 'crates', 'idemgate-node', 'Cargo.toml'))) {
  fail(`no native engine beside ${__dirname} and no idemgate checkout around it to build one from; install the published package (\`npm install idemgate\`), which brings ${platformPackage().name}`);
}
const profile = process.env.IDEMGATE_BUILD_PROFILE || 'release';
const manual =
  `cargo build --locked --profile ${profile} -p idemgate-node (in ${root}), then copy ` +
  `target/${profile === 'dev' ? 'debug' : profile}/${libraryName()} to ${local}`;
if (spawnSync('cargo', ['--version'], { stdio: 'ignore' }).error) {
  fail(`the native engine is not built and cargo is not on PATH: install Rust (rustup.rs) and run npm install again, or run: ${manual}`);
}

console.error(`idemgate: building the native engine with cargo (${profile}; minutes the first time) in ${root}`);
const build = spawnSync('cargo', ['build', '--locked', '--profile', profile, '-p', 'idemgate-node'], { cwd: root, stdio: 'inherit' });
if (build.status !== 0) fail(`the build failed (see above); the command was: ${manual}`);

// Where cargo put it: the target directory may be moved (CARGO_TARGET_DIR, .cargo/config).
const meta = spawnSync('cargo', ['metadata', '--format-version', '1', '--no-deps', '--locked'], { cwd: root, encoding: 'utf8', maxBuffer: 1 << 26 });
if (meta.status !== 0) fail(`cargo metadata failed: ${meta.stderr}`);
const built = path.join(JSON.parse(meta.stdout).target_directory, profile === 'dev' ? 'debug' : profile, libraryName());
fs.copyFileSync(built, local);
console.error(`idemgate: the native engine is ${local}`);

/** The file name cargo gives the addon's cdylib on this platform. */
function libraryName() {
  if (process.platform === 'win32') return 'idemgate_node.dll';
  return process.platform === 'darwin' ? 'libidemgate_node.dylib' : 'libidemgate_node.so';
}
