'use strict';
// The native addon (crates/idemgate-node) for this platform, found in this order:
// 1. IDEMGATE_NODE_ADDON, a file you name;
// 2. `idemgate.<platform>-<arch>.node` beside this file: a checkout's own build (the package's
//    install script, install.cjs, or scripts/test-node puts it there);
// 3. the platform package `@idemgate/<platform>-<arch>[-<libc>]` (platform.cjs), which the
//    published package names as an optional dependency.
const fs = require('node:fs');
const { LOCAL_ADDON, platformPackage, missingPackage } = require('./platform.cjs');

function load() {
  const named = process.env.IDEMGATE_NODE_ADDON;
  if (named) return loadFile(named);
  if (fs.existsSync(LOCAL_ADDON)) return loadFile(LOCAL_ADDON);
  const { name } = platformPackage();
  let file;
  try {
    file = require.resolve(name);
  } catch {
    throw new Error(missingPackage('native engine', 'IDEMGATE_NODE_ADDON'));
  }
  return loadFile(file);
}

function loadFile(file) {
  try {
    return require(file);
  } catch (e) {
    throw new Error(
      `idemgate: cannot load the native engine ${file} (${e.message}); it must be the addon built ` +
        'for this platform and this version of idemgate',
    );
  }
}

module.exports = load();
