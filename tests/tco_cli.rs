//! `squeeze tco`: the arithmetic against the hand-computed cases written in
//! docs/TCO.md, the measured figures read from scan and bench JSON, and
//! clear errors for missing fields and bad flags.

use serde_json::{json, Value};
use std::path::Path;
use std::process::Command;

fn tco(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_squeeze"))
        .arg("tco")
        .args(args)
        .output()
        .expect("run squeeze tco");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn tco_json(args: &[&str]) -> Value {
    let mut a = args.to_vec();
    a.push("--json");
    let (ok, out, err) = tco(&a);
    assert!(ok, "{err}");
    serde_json::from_str(&out).unwrap()
}

fn scenario<'a>(r: &'a Value, name: &str) -> &'a Value {
    r["scenarios"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == name)
        .unwrap()
}

fn close(got: &Value, want: f64, what: &str) {
    let g = got.as_f64().unwrap_or_else(|| panic!("{what}: {got}"));
    assert!((g - want).abs() < 0.005, "{what}: got {g}, want {want}");
}

/// (name, drives, servers, cpu, servers capex, drives capex, watts, energy, tco, $/TB)
type Row = (
    &'static str,
    u64,
    u64,
    &'static str,
    f64,
    f64,
    f64,
    f64,
    f64,
    f64,
);

fn check(r: &Value, rows: &[Row]) {
    for &(name, drives, servers, cpu, scapex, dcapex, watts, energy, total, per_tb) in rows {
        let s = scenario(r, name);
        assert_eq!(s["drives"], drives, "{name}");
        assert_eq!(s["servers"], servers, "{name}");
        assert_eq!(s["cpu"], cpu, "{name}");
        close(&s["servers_capex"], scapex, name);
        close(&s["drives_capex"], dcapex, name);
        close(&s["power_watts"], watts, name);
        close(&s["energy_cost"], energy, name);
        close(&s["tco"], total, name);
        close(&s["cost_per_effective_tb"], per_tb, name);
    }
}

const EXAMPLE: [&str; 14] = [
    "--throughput",
    "200",
    "--read-throughput",
    "400",
    "--cpu-ratio",
    "2.285",
    "--offload-ratio",
    "2.0",
    "--offload-cost",
    "2000",
    "--offload-power",
    "25",
    "--ratio",
    "2.0",
];

/// docs/TCO.md, "Worked example": every figure written there.
#[test]
fn worked_example_matches_the_doc() {
    let mut a = EXAMPLE.to_vec();
    a.extend(["--cpu-s-per-gib", "1.0,0.25"]);
    let r = tco_json(&a);
    check(
        &r,
        &[
            (
                "none",
                613,
                52,
                "xeon-gold-5318n",
                665_600.0,
                235_392.0,
                35_956.0,
                354_589.083,
                1_255_581.083,
                1_255.581083,
            ),
            (
                "classic-cpu",
                269,
                32,
                "xeon-gold-6338",
                492_800.0,
                103_296.0,
                24_348.0,
                240_113.889,
                836_209.889,
                836.209889,
            ),
            (
                "squeeze",
                307,
                26,
                "xeon-gold-6338",
                400_400.0,
                117_888.0,
                20_844.0,
                205_558.317,
                723_846.317,
                723.846317,
            ),
            (
                "offload",
                307,
                26,
                "xeon-gold-5318n",
                384_800.0,
                117_888.0,
                18_634.0,
                183_763.849_5,
                686_451.849_5,
                686.4518495,
            ),
        ],
    );
    let s = scenario(&r, "none");
    assert_eq!(s["servers_for_capacity"], 52);
    assert_eq!(s["servers_for_throughput"], 25);
    assert_eq!(s["servers_for_cores"], 17);
    close(&s["raw_tb"], 2352.941176, "none raw");
    let c = scenario(&r, "classic-cpu");
    assert_eq!(c["servers_for_capacity"], 23);
    assert_eq!(c["servers_for_throughput"], 32);
    close(&c["server_gbps"], 6.308, "classic per-server");
    let q = scenario(&r, "squeeze");
    close(&q["cores_needed"], 1305.3968, "squeeze cores");
    assert_eq!(q["servers_for_cores"], 21);
    // Hand-computed: 1026 + 0.931323 * (200 * 1.0 + 400 * 0.25).
    let cores = 1026.0 + 1e9 / f64::from(1u32 << 30) * 300.0;
    close(&q["cores_needed"], cores, "squeeze cores formula");
    let sv = &r["squeeze_saving"];
    close(&sv["vs_none"], 1.0 - 723_846.317 / 1_255_581.083, "vs none");
    close(
        &sv["vs_classic_cpu"],
        1.0 - 723_846.317 / 836_209.889,
        "vs classic",
    );
    close(
        &sv["vs_offload"],
        1.0 - 723_846.317 / 686_451.849_5,
        "vs offload",
    );
    assert_eq!(
        format!("{:.1}", 100.0 * sv["vs_none"].as_f64().unwrap()),
        "42.3"
    );
    assert_eq!(
        format!("{:.1}", 100.0 * sv["vs_classic_cpu"].as_f64().unwrap()),
        "13.4"
    );
    assert_eq!(
        format!("{:.1}", 100.0 * sv["vs_offload"].as_f64().unwrap()),
        "-5.4"
    );
}

/// docs/TCO.md, "A cheaper codec moves squeeze to the smaller SKU".
#[test]
fn cheaper_codec_gets_the_smaller_sku_as_in_the_doc() {
    let mut a = EXAMPLE.to_vec();
    a.extend(["--cpu-s-per-gib", "0.44,0.115"]);
    let r = tco_json(&a);
    check(
        &r,
        &[(
            "squeeze",
            307,
            26,
            "xeon-gold-5318n",
            332_800.0,
            117_888.0,
            17_984.0,
            177_353.712,
            628_041.712,
            628.041712,
        )],
    );
    close(
        &scenario(&r, "squeeze")["cores_needed"],
        1150.797225,
        "cores",
    );
    let sv = &r["squeeze_saving"];
    assert_eq!(
        format!("{:.1}", 100.0 * sv["vs_none"].as_f64().unwrap()),
        "50.0"
    );
    assert_eq!(
        format!("{:.1}", 100.0 * sv["vs_classic_cpu"].as_f64().unwrap()),
        "24.9"
    );
    assert_eq!(
        format!("{:.1}", 100.0 * sv["vs_offload"].as_f64().unwrap()),
        "8.5"
    );
    // The doc's commands are in the doc.
    let doc =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/TCO.md")).unwrap();
    for figure in [
        "$1,255,581.08",
        "$836,209.89",
        "$723,846.32",
        "$686,451.85",
        "$628,041.71",
    ] {
        assert!(doc.contains(figure), "docs/TCO.md lacks {figure}");
    }
}

#[test]
fn erasure_coding_and_defaults() {
    // Defaults: 1 PB, 100 GB/s, 2x replication. EC 4+2 instead: P = 1.5.
    let r = tco_json(&["--ratio", "1.5", "--cpu-s-per-gib", "2", "--ec", "4+2"]);
    let s = scenario(&r, "squeeze");
    // raw = 1000 / 1.5 * 1.5 / 0.85 = 1176.47 TB -> 307 drives -> 26 servers.
    close(&s["raw_tb"], 1000.0 / 0.85, "raw");
    assert_eq!(s["drives"], 307);
    assert_eq!(s["servers"], 26);
    // cores = 100 * 5.13 + 100 * 0.931323 * 2 = 699.26; 26.9 per server.
    close(
        &s["cores_needed"],
        513.0 + 200.0 * 1e9 / f64::from(1u32 << 30),
        "cores",
    );
    assert_eq!(s["cpu"], "xeon-gold-5318n");
    assert_eq!(r["model"]["protection_desc"], "erasure coding 4+2");
    let n = scenario(&r, "none");
    close(&n["raw_tb"], 1000.0 * 1.5 / 0.85, "none raw");
}

#[test]
fn reads_scan_and_bench_json() {
    let dir = tempfile::tempdir().unwrap();
    // Real scan output.
    let data = dir.path().join("t.txt");
    std::fs::write(&data, squeeze_codec::testdata::text(1 << 20, 1)).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_squeeze"))
        .args(["scan", data.to_str().unwrap(), "--json"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let scan_path = dir.path().join("scan.json");
    std::fs::write(&scan_path, &out.stdout).unwrap();
    let scan: Value = serde_json::from_slice(&out.stdout).unwrap();
    let r = tco_json(&["--from-json", scan_path.to_str().unwrap()]);
    let m = &r["model"]["measured"];
    assert_eq!(m["ratio"], scan["recommendation"]["ratio"]);
    assert_eq!(
        m["cpu_s_per_gib_compress"],
        scan["recommendation"]["cpu_seconds_per_gib"]["compress"]
    );
    assert_eq!(
        m["cpu_s_per_gib_decompress"],
        scan["recommendation"]["cpu_seconds_per_gib"]["decompress"]
    );
    assert!(r["source"].as_str().unwrap().contains("squeeze scan"));
    // A chosen row instead of the recommendation.
    let r = tco_json(&[
        "--from-json",
        scan_path.to_str().unwrap(),
        "--scan-algorithm",
        "zstd:9",
        "--scan-blob",
        "64K",
    ]);
    let row = scan["all"]["codecs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["algorithm"] == "zstd:9" && c["blob_size"] == 65536)
        .unwrap();
    assert_eq!(r["model"]["measured"]["ratio"], row["ratio"]);
    // Command-line figures override the JSON.
    let r = tco_json(&["--from-json", scan_path.to_str().unwrap(), "--ratio", "3"]);
    assert_eq!(r["model"]["measured"]["ratio"], 3.0);

    // Bench output (the keys of src/cmd/bench/report.rs's Report).
    let bench = json!({
        "machine": "x", "cores": 2, "threads": 2, "algorithm": "zstd:1", "mode": "aggressive",
        "max_blob": 131072, "data": "fio-like", "bytes": 1, "write_mbps": 900.0,
        "read_mbps": 2000.0, "ratio": 2.4, "raw_ratio": 2.45,
        "cpu_seconds_per_gib_write": 1.5, "cpu_seconds_per_gib_read": 0.4
    });
    let bench_path = dir.path().join("bench.json");
    std::fs::write(&bench_path, bench.to_string()).unwrap();
    let r = tco_json(&["--from-json", bench_path.to_str().unwrap()]);
    let m = &r["model"]["measured"];
    assert_eq!(m["ratio"], 2.4);
    assert_eq!(m["cpu_s_per_gib_compress"], 1.5);
    assert_eq!(m["cpu_s_per_gib_decompress"], 0.4);
    assert!(r["source"].as_str().unwrap().contains("squeeze bench"));
}

#[test]
fn missing_fields_and_bad_flags_get_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, v: Value| {
        let p = dir.path().join(name);
        std::fs::write(&p, v.to_string()).unwrap();
        p
    };
    let cases: Vec<(std::path::PathBuf, &str)> = vec![
        (
            write(
                "scan.json",
                json!({"tool": "squeeze scan", "recommendation": {"ratio": 2.0}}),
            ),
            "squeeze scan JSON has no field `recommendation.cpu_seconds_per_gib.compress`",
        ),
        (
            write(
                "bench.json",
                json!({"write_mbps": 1.0, "ratio": 2.0, "cpu_seconds_per_gib_write": 1.0}),
            ),
            "squeeze bench JSON has no field `cpu_seconds_per_gib_read`",
        ),
        (
            write(
                "bench2.json",
                json!({"write_mbps": 1.0, "cpu_seconds_per_gib_write": 1.0, "cpu_seconds_per_gib_read": 1.0}),
            ),
            "squeeze bench JSON has no field `ratio`",
        ),
        (
            write("other.json", json!({"hello": 1})),
            "neither squeeze scan JSON",
        ),
    ];
    for (path, want) in &cases {
        let (ok, _, err) = tco(&["--from-json", path.to_str().unwrap()]);
        assert!(!ok);
        assert!(err.contains(want), "{err}");
        assert!(
            err.contains(path.to_str().unwrap()),
            "names the file: {err}"
        );
    }
    let not_json = dir.path().join("x.json");
    std::fs::write(&not_json, "not json").unwrap();
    let (ok, _, err) = tco(&["--from-json", not_json.to_str().unwrap()]);
    assert!(!ok && err.contains("not valid JSON"), "{err}");
    let (ok, _, err) = tco(&["--from-json", "/nonexistent/scan.json"]);
    assert!(
        !ok && err.contains("cannot read /nonexistent/scan.json"),
        "{err}"
    );
    let (ok, _, err) = tco(&[]);
    assert!(!ok && err.contains("--from-json"), "{err}");
    for (args, want) in [
        (vec!["--ratio", "0.5"], "must be >= 1"),
        (
            vec!["--ratio", "2", "--cpu-throughput-loss", "1.5"],
            "--cpu-throughput-loss",
        ),
        (vec!["--ratio", "2", "--ec", "4-2"], "want K+M"),
        (vec!["--ratio", "2", "--usable", "0"], "--usable"),
        (vec!["--ratio", "2", "--capacity", "lots"], "not a capacity"),
        (
            vec!["--ratio", "2", "--cpu", "x:1:2"],
            "NAME:CORES:COST:WATTS",
        ),
        (vec!["--cpu-s-per-gib", "1"], "needs --ratio"),
    ] {
        let (ok, _, err) = tco(&args);
        assert!(!ok, "{args:?}");
        assert!(err.contains(want), "{args:?}: {err}");
    }
}

#[test]
fn table_and_chart() {
    let dir = tempfile::tempdir().unwrap();
    let chart = dir.path().join("tco.svg");
    let mut a = EXAMPLE.to_vec();
    a.extend([
        "--cpu-s-per-gib",
        "1.0,0.25",
        "--chart",
        chart.to_str().unwrap(),
    ]);
    let (ok, out, err) = tco(&a);
    assert!(ok, "{err}");
    assert!(
        out.contains("squeeze saves 42.3% against no compression, 13.4% against CPU compression"),
        "{out}"
    );
    for name in [
        "none",
        "classic-cpu",
        "squeeze",
        "offload",
        "1255581",
        "723.85",
    ] {
        assert!(out.contains(name), "{name}: {out}");
    }
    let svg = std::fs::read_to_string(&chart).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains(">classic-cpu</text>"));
}
