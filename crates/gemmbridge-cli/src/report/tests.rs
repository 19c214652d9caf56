use super::*;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The repository's own page holds every table its manifest puts on it, links every plot and
/// has no table of its own, docs/figures/ holds exactly those plots, README.md and the page
/// hold their headlines; the burn adapter's README holds the device-ordering table.
#[test]
fn performance_page_matches_its_runs() {
    let out = std::env::temp_dir().join(format!("gemmbridge-report-test-{}", std::process::id()));
    let page = std::fs::read_to_string(root().join("docs/PERFORMANCE.md")).unwrap();
    let (printed, wrong) = report(&root().join("docs/results/report.json"), &out, Some(&page)).unwrap();
    assert!(wrong.is_empty(), "docs/PERFORMANCE.md is out of date (run gemmbridge report): {wrong:?}");
    let svg = std::fs::read_to_string(out.join("conv-forward.svg")).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains("bf16"), "{}", &svg[..200.min(svg.len())]);
    // docs/figures holds exactly the plots the manifest draws (none for what is off the page)
    let names = |dir: &Path| {
        let mut v: Vec<String> =
            std::fs::read_dir(dir).unwrap().flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect();
        v.sort();
        v
    };
    assert_eq!(names(&root().join("docs/figures")), names(&out), "docs/figures/ against the plots the report draws");
    let _ = std::fs::remove_dir_all(out);
    let burn = std::fs::read_to_string(root().join("crates/gemmbridge-burn/README.md")).unwrap();
    let ordering = printed.split("## burn-ordering\n\n").nth(1).unwrap().split("\n\n").next().unwrap();
    assert!(burn.contains(ordering), "crates/gemmbridge-burn/README.md lacks:\n{ordering}");
}

#[test]
fn fill_replaces_names_and_refuses_unknown_ones() {
    let v = |n: &str| (n == "k").then(|| "4096".to_string());
    assert_eq!(fill("Linear {k} → {k}", v).unwrap(), "Linear 4096 → 4096");
    assert!(fill("{n}", v).is_err());
    assert!(fill("{k", v).is_err());
    assert_eq!(quoted("{a.means:x|y} and {b.range:× F.rms_norm}, {c}"), ["a", "b", "c"]);
}

/// `--check` fails for a page that lacks a table, a plot's link, or that holds a table of
/// its own; it passes for the page made of what the report printed.
#[test]
fn check_names_what_a_page_lacks_and_tables_it_should_not_have() {
    let dir = std::env::temp_dir().join(format!("gemmbridge-report-check-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("r.jsonl"), "{\"m\":1,\"x\":2.5}\n{\"m\":2,\"x\":0.5}\n").unwrap();
    let o = r#"{"op":"env","device":"X"}
{"op":"linear","dtype":"f16","m":64,"n":64,"k":64,"batch":1,"median_ms":1.0,"min_ms":1.0,"tflops":1.0}"#;
    let p = o.replace("\"median_ms\":1.0", "\"median_ms\":2.0");
    std::fs::write(dir.join("o.jsonl"), o).unwrap();
    std::fs::write(dir.join("p.jsonl"), p).unwrap();
    let manifest = r#"{"figures":[{"id":"f","title":"F","ours":["o.jsonl"],"peer":["p.jsonl"]},
                                  {"id":"g","title":"G","ours":["o.jsonl"],"peer":["p.jsonl"],"bound":3.0,"page":false}],
        "tables":[{"id":"t","runs":{"r":["r.jsonl"]},"key":[{"header":"m","value":"{m}"}],
                   "columns":[{"header":"x","runs":"r","field":"x","format":"fixed:1"}],
                   "plot":{"title":"T","columns":["x"],"y":"x"}}],
        "headlines":[{"page":"readme.md","text":"{f.mean_max_pct} % ahead, lowest {f.lowest} ({f.below} below {f.bound})"}]}"#;
    // the headline, wrapped as a page would wrap it
    std::fs::write(dir.join("readme.md"), "It is 100 % ahead,\nlowest 2.000 (0 below 0.97) here.\n").unwrap();
    std::fs::write(dir.join("report.json"), manifest).unwrap();
    let figs = dir.join("figures");
    let (printed, _) = report(&dir.join("report.json"), &figs, None).unwrap();
    let table_t = "| m | x |\n|---|---:|\n| 1 | 2.5 |\n| 2 | 0.5 |";
    assert!(printed.contains(table_t), "{printed}");
    assert!(printed.contains("| f16 | linear | 1 | 2.000 | 2.000 | 2.000 | 0 |"), "{printed}");
    let good = format!("{printed}\n![f](figures/f.svg) ![t](figures/t.svg)\n");
    let check = |page: &str| report(&dir.join("report.json"), &figs, Some(page)).unwrap().1;
    assert_eq!(check(&good), Vec::<String>::new());
    // a figure off the page is printed, need not be on it, and draws no plot
    let table_g = "| dtype | op | rows | geometric mean | lowest | highest | rows < 3 |";
    assert!(printed.contains(&format!("## G (not on the page)\n\n{table_g}")), "{printed}");
    assert!(figs.join("f.svg").exists() && !figs.join("g.svg").exists());
    let without_g = good.replace(table_g, "");
    assert_eq!(check(&without_g), Vec::<String>::new());
    let without_t = good.replace(table_t, "");
    assert_eq!(check(&without_t), vec!["t: its table".to_string()]);
    let without_plot = good.replace("figures/t.svg", "");
    assert_eq!(check(&without_plot), vec!["t: a link to t.svg".to_string()]);
    let typed = format!("{good}\n| a | b |\n|---|---|\n| 1 | 2 |\n");
    let wrong = check(&typed);
    assert_eq!(wrong.len(), 1, "{wrong:?}");
    assert!(wrong[0].contains("a table the manifest does not make (| a | b |)"), "{wrong:?}");
    // one number typed differently from the runs is a table the manifest does not make
    let edited = good.replace("| 2 | 0.5 |", "| 2 | 0.6 |");
    assert_eq!(check(&edited).len(), 2, "{:?}", check(&edited));
    // the headline is printed, and a page whose headline differs from the runs fails
    assert!(printed.contains("100 % ahead, lowest 2.000 (0 below 0.97)"), "{printed}");
    std::fs::write(dir.join("readme.md"), "It is 90 % ahead, lowest 2.000 (0 below 0.97).\n").unwrap();
    let wrong = check(&good);
    assert!(wrong.len() == 1 && wrong[0].contains("readme.md: its headline"), "{wrong:?}");
    let _ = std::fs::remove_dir_all(dir);
}
/// The figures and tables of a pending folder, and the headlines that quote them, are
/// skipped and named; the page passes without them; a pending folder that exists, or that
/// nothing reads, is an error.
#[test]
fn a_pending_folder_skips_what_reads_it_until_its_runs_are_in() {
    let dir = std::env::temp_dir().join(format!("gemmbridge-report-pending-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("r.jsonl"), "{\"m\":1,\"x\":2.5}\n").unwrap();
    let manifest = |pending: &str| {
        format!(
            r#"{{"figures":[{{"id":"f","title":"F","ours":["new/o.jsonl"],"peer":["new/p.jsonl"]}}],
                "tables":[{{"id":"t","runs":{{"r":["r.jsonl"]}},"key":[{{"header":"m","value":"{{m}}"}}],
                           "columns":[{{"header":"x","runs":"r","field":"x","format":"fixed:1"}}]}},
                          {{"id":"u","runs":{{"r":["new/u.jsonl"]}},"key":[{{"header":"m","value":"{{m}}"}}],
                           "columns":[{{"header":"x","runs":"r","field":"x","format":"fixed:1"}}]}}],
                "headlines":[{{"page":"readme.md","text":"x at {{t.range:x}}"}},
                             {{"page":"readme.md","text":"u at {{u.range:x}}, f at {{f.lowest}}"}}],
                "pending":{pending}}}"#
        )
    };
    std::fs::write(dir.join("readme.md"), "x at 2.5\n").unwrap();
    let run = |pending: &str| {
        std::fs::write(dir.join("report.json"), manifest(pending)).unwrap();
        report(&dir.join("report.json"), &dir.join("figures"), Some("| m | x |\n|---|---:|\n| 1 | 2.5 |\n"))
    };
    let (printed, wrong) = run(r#"["new/"]"#).unwrap();
    assert_eq!(wrong, Vec::<String>::new());
    assert!(printed.contains("## f (pending: its runs, under new/, are not in yet)"), "{printed}");
    assert!(printed.contains("## u (pending: its runs, under new/, are not in yet)"), "{printed}");
    assert!(printed.contains("## headline for readme.md (pending)\n\nu at {u.range:x}"), "{printed}");
    assert!(printed.contains("## headline for readme.md\n\nx at 2.5"), "{printed}");
    // not pending: the missing runs are an error
    let e = run("[]").err().map(|e| format!("{e:#}"));
    assert!(e.as_deref().is_some_and(|e| e.contains("new/o.jsonl")), "{e:?}");
    let e = run(r#"["old"]"#).err().map(|e| e.to_string());
    assert!(e.as_deref().is_some_and(|e| e.contains("no figure or table reads a file under it")), "{e:?}");
    std::fs::create_dir_all(dir.join("new")).unwrap();
    let e = run(r#"["new"]"#).err().map(|e| e.to_string());
    let _ = std::fs::remove_dir_all(&dir);
    assert!(e.as_deref().is_some_and(|e| e.contains("exists; take it off")), "{e:?}");
}

#[test]
fn a_manifest_with_nothing_to_report_is_an_error_naming_it() {
    let dir = std::env::temp_dir().join(format!("gemmbridge-report-empty-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("report.json");
    for text in [r#"{"figures": []}"#, r#"{"figures": [], "tables": [], "headlines": []}"#] {
        std::fs::write(&path, text).unwrap();
        let e = report(&path, &dir.join("figures"), None).err().map(|e| e.to_string());
        let want = format!("{}: the manifest lists no figure and no table: nothing to report", path.display());
        assert_eq!(e.as_deref(), Some(want.as_str()));
    }
    // refused before anything is written
    assert!(!dir.join("figures").exists());
    let _ = std::fs::remove_dir_all(&dir);
}
