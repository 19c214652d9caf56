use super::*;

fn table(json: &str) -> Table {
    serde_json::from_str(json).unwrap()
}

fn dir(name: &str, files: &[(&str, &str)]) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("gemmbridge-report-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    for (f, body) in files {
        std::fs::write(d.join(f), body).unwrap();
    }
    d
}

#[test]
fn formats() {
    assert_eq!(format_value(618.7, "fixed:0").unwrap(), "619");
    assert_eq!(format_value(2.029e-7, "sci:1").unwrap(), "2.0e-7");
    assert_eq!(format_value(1e-5, "sci:0").unwrap(), "1e-5");
    assert_eq!(format_value(79.2, "sig:2").unwrap(), "79");
    assert_eq!(format_value(324.2, "sig:2").unwrap(), "324");
    assert_eq!(format_value(0.199547, "sig:2").unwrap(), "0.20");
    assert_eq!(format_value(0.0123, "sig:2").unwrap(), "0.012");
    assert_eq!(format_value(0.8749, "pct:0").unwrap(), "87");
    assert!(format_value(1.0, "round:2").is_err());
    assert!(format_value(1.0, "fixed").is_err());
}

#[test]
fn medians_per_key_a_dash_where_a_set_lacks_the_row_and_rows_in_first_seen_order() {
    let d = dir(
        "fields",
        &[
            ("a.jsonl", "{\"m\":2,\"dtype\":\"f16\",\"x\":1.0}\n{\"m\":1,\"dtype\":\"f32\",\"x\":5.0}\n"),
            ("b.jsonl", "{\"m\":2,\"dtype\":\"f16\",\"x\":3.0}\n"),
            ("c.jsonl", "{\"m\":2,\"dtype\":\"f16\",\"x\":10.0}\n{\"op\":\"env\"}\n"),
            ("z.jsonl", "{\"m\":2,\"dtype\":\"f16\",\"x\":0.25}\n"),
        ],
    );
    let t = table(
        r#"{"id":"t","runs":{"three":["a.jsonl","b.jsonl","c.jsonl"],"other":["z.jsonl"]},
            "key":[{"header":"m","value":"{m}×{m}"},{"header":"dtype","value":"{dtype}"}],
            "columns":[{"header":"x","runs":"three","field":"x","format":"fixed:2"},
                       {"header":"x, other","runs":"other","field":"x","format":"fixed:3"}],
            "plot":{"title":"p","columns":["x, other"],"y":"x"}}"#,
    );
    let made = t.make(&mut Sets::new(&d)).unwrap();
    let _ = std::fs::remove_dir_all(&d);
    assert_eq!(
        made.markdown,
        "| m | dtype | x | x, other |\n|---|---|---:|---:|\n| 2×2 | f16 | 3.00 | 0.250 |\n| 1×1 | f32 | 5.00 | – |\n"
    );
    assert_eq!(
        t.plot_rows(&made).unwrap(),
        vec![("2×2 f16".to_string(), vec![Some(0.25)]), ("1×1 f32".to_string(), vec![None])]
    );
}

#[test]
fn ranges_filters_names_and_units() {
    let d = dir(
        "fields-range",
        &[(
            "f.jsonl",
            "{\"warm\":false,\"t\":79.2,\"w\":0.0002}\n{\"warm\":true,\"t\":0.44,\"w\":70.9}\n\
             {\"warm\":false,\"t\":87.3,\"w\":0.0002}\n{\"warm\":true,\"t\":0.48,\"w\":78.0}\n",
        )],
    );
    let t = table(
        r#"{"id":"t","runs":{"all":["f.jsonl"]},
            "key":[{"header":"","value":"{warm}","names":{"false":"cold","true":"warm"}}],
            "columns":[{"header":"warm-up","runs":"all","field":"w","format":"sig:2","agg":"range","unit":" ms",
                        "where":{"warm":true},"missing":"—"},
                       {"header":"first","runs":"all","field":"t","format":"sig:2","agg":"range","unit":" ms"}]}"#,
    );
    let made = t.make(&mut Sets::new(&d)).unwrap();
    let _ = std::fs::remove_dir_all(&d);
    assert_eq!(
        made.markdown,
        "| | warm-up | first |\n|---|---:|---:|\n| cold | — | 79–87 ms |\n| warm | 71–78 ms | 0.44–0.48 ms |\n"
    );
}

#[test]
fn a_field_no_line_has_is_an_error() {
    let d = dir("fields-typo", &[("f.jsonl", "{\"m\":1,\"x\":1.0}\n")]);
    let t = table(
        r#"{"id":"t","runs":{"all":["f.jsonl"]},"key":[{"header":"m","value":"{m}"}],
            "columns":[{"header":"x","runs":"all","field":"x_ms","format":"fixed:1"}]}"#,
    );
    let e = t.make(&mut Sets::new(&d)).err().unwrap().to_string();
    let _ = std::fs::remove_dir_all(&d);
    assert!(e.contains("has the field \"x_ms\""), "{e}");
}

/// Packed runs of two sides as the benches write them: gemmbridge's (`o.jsonl`) and the peer's
/// (`p.jsonl`, a plain row and a `+compile` row per problem, and a layer row with each way's
/// time under `backends`), three runs each, plus rows of other ops the tables leave out.
fn paired_runs(name: &str) -> std::path::PathBuf {
    // norm 2048: ours 1, 2, 4 ms; peer 2, 2, 2 (ratios 2, 1, 0.5 -> 1); +compile 1.5 each (1.5, 0.75, 0.375 -> 0.75)
    // norm 8192: ours 1 ms, peer 3, compiled 1 ms; only runs 1 and 2 have the compiled row
    // layer s 4096: ours 10 ms; eager 12, 11, 13 ms (-> 1.2); compile 9 ms, then an error, then 9 ms
    // layer s 1024: ours 5 ms; eager 6 ms, compile 5.5 ms every time
    let mut o = String::new();
    let mut p = String::new();
    for (i, ms) in [1.0, 2.0, 4.0].iter().enumerate() {
        let run = i + 1;
        o += &format!("{{\"run\":{run},\"op\":\"env\",\"device\":\"X\"}}\n");
        o += &format!("{{\"run\":{run},\"op\":\"rmsnorm\",\"dtype\":\"bf16\",\"m\":2048,\"layout\":\"d4096\",\"median_ms\":{ms},\"tbps\":{}}}\n", 4.0 / ms);
        o += &format!("{{\"run\":{run},\"op\":\"rmsnorm\",\"dtype\":\"bf16\",\"m\":8192,\"layout\":\"d4096\",\"median_ms\":1.0,\"tbps\":3.0}}\n");
        o += &format!(
            "{{\"run\":{run},\"op\":\"rope\",\"dtype\":\"bf16\",\"m\":8192,\"median_ms\":0.5,\"of_copy\":0.8{run}}}\n"
        );
        o += &format!("{{\"run\":{run},\"op\":\"layer_fwd\",\"dtype\":\"bf16\",\"m\":4096,\"layout\":\"llama3-8b\",\"median_ms\":10.0}}\n");
        p += &format!("{{\"run\":{run},\"op\":\"rmsnorm\",\"dtype\":\"bf16\",\"m\":2048,\"layout\":\"d4096\",\"median_ms\":2.0}}\n");
        p += &format!("{{\"run\":{run},\"op\":\"rmsnorm\",\"dtype\":\"bf16\",\"m\":2048,\"layout\":\"d4096+compile\",\"median_ms\":1.5}}\n");
        p += &format!("{{\"run\":{run},\"op\":\"rmsnorm\",\"dtype\":\"bf16\",\"m\":8192,\"layout\":\"d4096\",\"median_ms\":3.0}}\n");
        if run < 3 {
            p += &format!("{{\"run\":{run},\"op\":\"rmsnorm\",\"dtype\":\"bf16\",\"m\":8192,\"layout\":\"d4096+compile\",\"median_ms\":1.0}}\n");
        }
        let compile = if run == 2 { "\"OutOfMemoryError: …\"".to_string() } else { "9.0".to_string() };
        let eager = [12.0, 11.0, 13.0][i];
        p += &format!("{{\"run\":{run},\"op\":\"layer_fwd\",\"dtype\":\"bf16\",\"m\":4096,\"layout\":\"llama3-8b\",\"median_ms\":9.0,\"backends\":{{\"eager\":{eager},\"compile\":{compile}}}}}\n");
        o += &format!("{{\"run\":{run},\"op\":\"layer_fwd\",\"dtype\":\"bf16\",\"m\":1024,\"layout\":\"llama3-8b\",\"median_ms\":5.0}}\n");
        p += &format!("{{\"run\":{run},\"op\":\"layer_fwd\",\"dtype\":\"bf16\",\"m\":1024,\"layout\":\"llama3-8b\",\"median_ms\":5.5,\"backends\":{{\"eager\":6.0,\"compile\":5.5}}}}\n");
    }
    dir(name, &[("o.jsonl", &o), ("p.jsonl", &p)])
}

/// A ratio column: per pair of runs the peer's line over ours of the same key, its median; "–"
/// where a pair lacks a line; `where` with a choice; a field inside an object; the stats.
#[test]
fn ratio_columns_take_the_median_of_the_pairs_ratios() {
    let d = paired_runs("fields-ratio");
    let t = table(
        r#"{"id":"norm","runs":{"ours":["o.jsonl"],"peer":["p.jsonl"]},"where":{"op":["rmsnorm","rmsnorm_fwd_bwd"]},
            "key":[{"header":"rows","value":"{m}"}],
            "columns":[{"header":"ms","runs":"ours","field":"median_ms","format":"fixed:1","agg":"range"},
                       {"header":"TB/s","runs":"ours","field":"tbps","format":"fixed:1"},
                       {"header":"× eager","runs":"peer","field":"median_ms","format":"fixed:3","where":{"layout":"d4096"},
                        "over":{"runs":"ours","field":"median_ms","where":{"layout":"d4096"}}},
                       {"header":"× compile","runs":"peer","field":"median_ms","format":"fixed:3","where":{"layout":"d4096+compile"},
                        "over":{"runs":"ours","field":"median_ms"}}]}"#,
    );
    let made = t.make(&mut Sets::new(&d)).unwrap();
    assert_eq!(
        made.markdown,
        "| rows | ms | TB/s | × eager | × compile |\n|---|---:|---:|---:|---:|\n\
         | 2048 | 1.0–4.0 | 2.0 | 1.000 | 0.750 |\n| 8192 | 1.0 | 3.0 | 3.000 | – |\n"
    );
    assert_eq!(t.stat(&made, "range:× eager").as_deref(), Some("1.000–3.000"));
    assert_eq!(t.stat(&made, "lowest:× eager|× compile").as_deref(), Some("0.750"));
    assert_eq!(t.stat(&made, "highest:× compile").as_deref(), Some("0.750"));
    assert_eq!(t.stat(&made, "mean:× eager").as_deref(), Some("1.732"), "√3");
    assert_eq!(t.stat(&made, "range:TB/s").as_deref(), Some("2.0–3.0"));
    assert_eq!(t.stat(&made, "range:× none"), None, "no such column");
    assert_eq!(t.stat(&made, "median:× eager"), None, "no such kind");
    // the layer: a field inside an object; a pair whose way failed (a text) leaves the cell out
    let layer = table(
        r#"{"id":"layer","runs":{"ours":["o.jsonl"],"peer":["p.jsonl"]},"where":{"op":"layer_fwd"},
            "key":[{"header":"s","value":"{m}"}],
            "columns":[{"header":"× eager","runs":"peer","field":"backends.eager","format":"fixed:2",
                        "over":{"runs":"ours","field":"median_ms"}},
                       {"header":"× compile","runs":"peer","field":"backends.compile","format":"fixed:2",
                        "over":{"runs":"ours","field":"median_ms"}},
                       {"header":"× fastest","runs":"peer","field":"median_ms","format":"fixed:2",
                        "over":{"runs":"ours","field":"median_ms"}}],
            "plot":{"title":"t","columns":["× compile","× eager"],"y":"ratio"}}"#,
    );
    let made = layer.make(&mut Sets::new(&d)).unwrap();
    let _ = std::fs::remove_dir_all(&d);
    assert_eq!(
        made.markdown,
        "| s | × eager | × compile | × fastest |\n|---|---:|---:|---:|\n| 4096 | 1.20 | – | 0.90 |\n| 1024 | 1.20 | 1.10 | 1.10 |\n"
    );
    let plotted = vec![("4096".to_string(), vec![None, Some(1.2)]), ("1024".to_string(), vec![Some(1.1), Some(1.2)])];
    assert_eq!(layer.plot_rows(&made).unwrap(), plotted);
}

/// A ratio column over sets of different run counts, a run with two lines of one key, a column
/// that no row has a value in: each an error naming it.
#[test]
fn ratio_columns_refuse_unpaired_runs_and_ambiguous_lines() {
    let d = paired_runs("fields-ratio-bad");
    std::fs::write(d.join("one.jsonl"), "{\"op\":\"rmsnorm\",\"m\":2048,\"median_ms\":1.0}\n").unwrap();
    let make = |columns: &str| {
        let t = table(&format!(
            r#"{{"id":"t","runs":{{"ours":["o.jsonl"],"peer":["p.jsonl"],"one":["one.jsonl"]}},"where":{{"op":"rmsnorm"}},
                "key":[{{"header":"rows","value":"{{m}}"}}],"columns":[{columns}]}}"#
        ));
        t.make(&mut Sets::new(&d)).err().map(|e| format!("{e:#}"))
    };
    let over = |runs: &str| format!(r#""over":{{"runs":"{runs}","field":"median_ms"}}"#);
    let e = make(&format!(r#"{{"header":"r","runs":"peer","field":"median_ms","format":"fixed:2",{}}}"#, over("one")));
    assert!(e.as_deref().is_some_and(|e| e.contains("holds 3 runs and \"one\" 1")), "{e:?}");
    // both of the peer's lines of a row count without a filter on the layout
    let e = make(&format!(r#"{{"header":"r","runs":"peer","field":"median_ms","format":"fixed:2",{}}}"#, over("ours")));
    assert!(
        e.as_deref().is_some_and(|e| e.contains("run 1 of \"peer\"") && e.contains("two lines of the row \"2048\"")),
        "{e:?}"
    );
    let e = make(r#"{"header":"r","runs":"ours","field":"median_ms","format":"fixed:2","where":{"dtype":"f16"}}"#);
    assert!(e.as_deref().is_some_and(|e| e.contains("column \"r\": no row has a value")), "{e:?}");
    let ok = make(&format!(
        r#"{{"header":"r","runs":"peer","field":"median_ms","format":"fixed:2","where":{{"layout":"d4096"}},{}}}"#,
        over("ours")
    ));
    let _ = std::fs::remove_dir_all(&d);
    assert_eq!(ok, None);
}
