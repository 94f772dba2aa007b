use super::*;

fn sample(op: &str, size: usize, in_place: bool, busbw: f64, memcpy: Option<f64>) -> Sample {
    Sample { op: op.into(), size, in_place, busbw_gbps: busbw, memcpy_gbps: memcpy }
}

fn run(label: &str, backend: &str, samples: Vec<Sample>) -> Run {
    Run { label: label.into(), backend: backend.into(), world_size: 4, samples }
}

fn two_runs() -> Vec<Run> {
    vec![
        run(
            "a",
            "cpu",
            vec![
                sample("all_reduce", 1024, false, 0.5, None),
                sample("all_reduce", 1024, true, 0.7, None),
                sample("all_reduce", 8, false, 0.01, None),
                sample("all_gather", 0, false, 0.0, None),
                sample("all_gather", 4096, false, 2.0, None),
            ],
        ),
        run(
            "b",
            "mpi",
            vec![sample("all_reduce", 8, false, 0.02, Some(1.0)), sample("all_reduce", 1024, false, 0.9, Some(8.0))],
        ),
    ]
}

#[test]
fn one_curve_per_run_and_op_sorted_out_of_place_without_zeros() {
    let c = curves(&two_runs()).unwrap();
    let labels: Vec<&str> = c.iter().map(|c| c.label.as_str()).collect();
    assert_eq!(labels, ["a all_reduce", "a all_gather", "b all_reduce", "memcpy (b)"]);
    assert_eq!(c[0].points, [(8.0, 0.01), (1024.0, 0.5)], "sorted by size, in place left out");
    assert_eq!(c[1].points, [(4096.0, 2.0)], "the 0-byte point cannot sit on a log axis");
    assert!(!c[2].reference && c[3].reference);
    assert_eq!(c[3].points, [(8.0, 1.0), (1024.0, 8.0)]);
}

#[test]
fn one_run_is_labelled_by_op_and_its_title_names_the_backend() {
    let runs = vec![run("x", "cpu", vec![sample("broadcast", 64, false, 1.0, Some(3.0))])];
    let c = curves(&runs).unwrap();
    assert_eq!(c.iter().map(|c| c.label.as_str()).collect::<Vec<_>>(), ["broadcast", "memcpy"]);
    assert_eq!(title(&runs), "oxccl bench: bus bandwidth, cpu backend, 4 ranks");
}

#[test]
fn runs_are_named_by_backend_unless_that_is_ambiguous() {
    let mut runs = two_runs();
    label_runs(&mut runs);
    assert_eq!((runs[0].label.as_str(), runs[1].label.as_str()), ("cpu x4", "mpi x4"));
    let mut same = vec![run("v1", "cpu", vec![]), run("v2", "cpu", vec![])];
    label_runs(&mut same);
    assert_eq!((same[0].label.as_str(), same[1].label.as_str()), ("v1", "v2"), "file names tell them apart");
    let one_op = vec![
        run("v1", "cpu", vec![sample("all_reduce", 8, false, 1.0, None)]),
        run("v2", "cpu", vec![sample("all_reduce", 8, false, 2.0, None)]),
    ];
    assert_eq!(curves(&one_op).unwrap()[1].label, "v2", "one op: the run alone names the line");
    assert_eq!(title(&one_op), "oxccl bench: bus bandwidth, v1 vs v2");
}

#[test]
fn nothing_to_draw_is_an_error() {
    let runs = vec![run("x", "cpu", vec![sample("barrier", 0, false, 0.0, None)])];
    assert!(curves(&runs).unwrap_err().contains("nothing to plot"));
}

#[test]
fn the_format_follows_the_extension() {
    assert_eq!(format_of(Path::new("a/b.SVG")), Ok(Format::Svg));
    assert_eq!(format_of(Path::new("b.png")), Ok(Format::Png));
    let e = format_of(Path::new("b.pdf")).unwrap_err();
    assert!(e.contains("b.pdf") && e.contains(".svg"), "{e}");
}

fn scratch(name: &str) -> std::path::PathBuf {
    // One directory for every run, its files overwritten: not one more per run.
    let d = std::env::temp_dir().join("oxccl-plot-test");
    std::fs::create_dir_all(&d).unwrap();
    d.join(name)
}

#[test]
fn an_svg_has_the_title_the_legend_and_byte_labels() {
    let runs = two_runs();
    let path = scratch("cmp.svg");
    draw(&curves(&runs).unwrap(), "my title", &path).unwrap();
    let svg = std::fs::read_to_string(&path).unwrap().replace('\n', "");
    assert!(svg.starts_with("<svg") || svg.contains("<svg"), "{}", &svg[..svg.len().min(200)]);
    for text in ["my title", "a all_reduce", "b all_reduce", "memcpy (b)", ">1K<", ">4K<", "bus bandwidth"] {
        assert!(svg.contains(text), "{text} missing from the SVG");
    }
    // Every line is a polyline; four curves plus the axes' lines.
    assert!(svg.matches("<polyline").count() >= 4);
}

#[test]
fn a_png_is_a_png_of_the_size_asked() {
    let path = scratch("one.png");
    let runs = vec![run(
        "x",
        "cpu",
        vec![sample("all_reduce", 8, false, 0.1, Some(2.0)), sample("all_reduce", 1 << 20, false, 5.0, Some(9.0))],
    )];
    draw(&curves(&runs).unwrap(), &title(&runs), &path).unwrap();
    let png = std::fs::read(&path).unwrap();
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    // The IHDR chunk: width and height, big-endian, right after the signature and header.
    let w = u32::from_be_bytes([png[16], png[17], png[18], png[19]]);
    let h = u32::from_be_bytes([png[20], png[21], png[22], png[23]]);
    assert_eq!((w, h), SIZE);
}

#[test]
fn unwritable_files_and_bad_inputs_are_named() {
    let runs = two_runs();
    let e = draw(&curves(&runs).unwrap(), "t", Path::new("/nonexistent-dir/p.svg")).unwrap_err();
    assert!(e.contains("/nonexistent-dir/p.svg"), "{e}");
    let bad = scratch("bad.json");
    std::fs::write(&bad, "{\"rows\": 3}").unwrap();
    let e = read_run(&bad).unwrap_err();
    assert!(e.contains("bad.json") && e.contains("oxccl bench --json"), "{e}");
    assert!(read_run(&scratch("missing.json")).unwrap_err().contains("missing.json"));
}

#[test]
fn bench_json_reads_back() {
    let report = crate::bench::json::Report {
        tool: "oxccl bench",
        version: "0",
        backend: "cpu".into(),
        world_size: 3,
        device: "cpu".into(),
        iters: "auto".into(),
        warmup: 5,
        check: true,
        rows: vec![crate::bench::json::Record {
            op: "all_gather",
            size: 3072,
            count: 768,
            dtype: "float",
            redop: "none",
            root: -1,
            in_place: false,
            algorithm: Some("ring"),
            time_us: 10.0,
            iters: 5,
            algbw_gbps: 0.3,
            busbw_gbps: 0.2,
            wrong: Some(0),
            memcpy_time_us: None,
            memcpy_gbps: None,
            memcpy_all_ranks_gbps: None,
        }],
    };
    let path = scratch("r.json");
    crate::bench::json::write(&path, &report).unwrap();
    let r = read_run(&path).unwrap();
    assert_eq!((r.label.as_str(), r.backend.as_str(), r.world_size), ("r", "cpu", 3));
    assert_eq!(r.samples, [sample("all_gather", 3072, false, 0.2, None)]);
    assert_eq!(Sample::from(&report.rows[0]), r.samples[0]);
}

#[test]
fn device_runs_are_named_by_their_device() {
    assert_eq!(super::backend_label("cpu", "cpu"), "cpu");
    assert_eq!(super::backend_label("cpu", "cuda:0"), "cpu on cuda:0");
    let dir = std::env::temp_dir().join(format!("oxccl-plot-device-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (a, b) = (dir.join("a.json"), dir.join("b.json"));
    std::fs::write(&a, r#"{"backend":"cpu","world_size":2,"rows":[]}"#).unwrap();
    std::fs::write(&b, r#"{"backend":"cpu","device":"cuda:0","world_size":2,"rows":[]}"#).unwrap();
    let mut runs = vec![super::read_run(&a).unwrap(), super::read_run(&b).unwrap()];
    super::label_runs(&mut runs);
    assert_eq!((runs[0].label.as_str(), runs[1].label.as_str()), ("cpu x2", "cpu on cuda:0 x2"));
    std::fs::remove_dir_all(&dir).unwrap();
}
