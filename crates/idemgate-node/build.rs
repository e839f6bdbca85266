//! Links the addon as Node expects a native module to be linked (napi-build).

fn main() {
    napi_build::setup();
}
