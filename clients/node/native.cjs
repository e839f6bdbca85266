'use strict';
// The native addon (crates/idemgate-node), built for this platform: the package carries
// `idemgate.<platform>-<arch>.node` beside this file (scripts/test-node builds it from the
// workspace; IDEMGATE_NODE_ADDON names another file).
const path = require('node:path');

const file =
  process.env.IDEMGATE_NODE_ADDON ||
  path.join(__dirname, `idemgate.${process.platform}-${process.arch}.node`);
let native;
try {
  native = require(file);
} catch (e) {
  throw new Error(
    `idemgate: cannot load the native engine ${file} (${e.message}); ` +
      'build it with scripts/test-node --build-only, or set IDEMGATE_NODE_ADDON',
  );
}
module.exports = native;
