//! Builds the ISA-L (igzip) shim when Debian's libisal-dev is installed
//! (found by pkg-config) and sets `cfg(squeeze_isal)`; without it the crate
//! builds with libdeflate alone and says so loudly (the ISA-L tests then
//! print SKIPPED, and fail under CI=true, which installs libisal-dev).

fn main() {
    println!("cargo::rustc-check-cfg=cfg(squeeze_isal)");
    println!("cargo::rerun-if-changed=csrc/isal_shim.c");
    println!("cargo::rerun-if-env-changed=SQUEEZE_NO_ISAL");
    if std::env::var_os("SQUEEZE_NO_ISAL").is_some() {
        println!("cargo::warning=SQUEEZE_NO_ISAL set: building without the ISA-L deflate engine");
        return;
    }
    match pkg_config::Config::new().probe("libisal") {
        Ok(lib) => {
            let mut b = cc::Build::new();
            b.file("csrc/isal_shim.c");
            for p in &lib.include_paths {
                b.include(p);
            }
            b.compile("sqz_isal_shim");
            println!("cargo::rustc-cfg=squeeze_isal");
        }
        Err(e) => println!(
            "cargo::warning=libisal not found ({e}): building without the ISA-L deflate engine \
             (apt-get install libisal-dev)"
        ),
    }
}
