//! Links the addon as Node expects a native module to be linked (napi-build).

fn main() {
    napi_build::setup();
    // A macOS library carries its own name (LC_ID_DYLIB), by default the path it was linked at:
    // the build machine's. Node loads the addon by its file path whatever the name says; the
    // package's name for it is the one to carry.
    if std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("macos") {
        println!("cargo:rustc-cdylib-link-arg=-Wl,-install_name,@rpath/idemgate.node");
    }
}
