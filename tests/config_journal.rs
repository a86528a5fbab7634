//! The `[journal]` limits: defaults, the TOML keys, `TEPHRA__JOURNAL__*`, the seed's own
//! `PAROS_*` variables, and every refusal (an unknown `PAROS_*` variable, an unparsable value,
//! a value below its floor).

use tephra::config::*;

fn env(vars: &[(&str, &str)]) -> Vec<(String, String)> {
    vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

fn resolve(vars: &[(&str, &str)]) -> Result<Settings, ConfigError> {
    resolve_sources(None, env(vars), &Overrides::default())
}

#[test]
fn defaults_are_the_seeds() {
    let j = resolve(&[]).unwrap().journal;
    assert_eq!(
        (j.max_batch_records, j.max_batch_bytes, j.max_read_records, j.max_read_bytes, j.max_wait_ms, j.min_wait_ms, j.admission_rounds),
        (1024, 1 << 20, 256, 65536, 1000, 0, 256)
    );
    assert_eq!(j, Settings::from_toml_str("").unwrap().journal);
}

#[test]
fn every_paros_variable_sets_its_key() {
    let s = resolve(&[
        ("PAROS_MAX_BATCH_RECORDS", "10"),
        ("PAROS_MAX_BATCH_BYTES", "20"),
        ("PAROS_MAX_READ_RECORDS", "30"),
        ("PAROS_MAX_READ_BYTES", "40"),
        ("PAROS_MAX_WAIT_MS", "50"),
        ("PAROS_MIN_WAIT_MS", "5"),
        ("PAROS_ADMISSION_ROUNDS", "70"),
    ])
    .unwrap()
    .journal;
    assert_eq!(
        (s.max_batch_records, s.max_batch_bytes, s.max_read_records, s.max_read_bytes, s.max_wait_ms, s.min_wait_ms, s.admission_rounds),
        (10, 20, 30, 40, 50, 5, 70)
    );
}

#[test]
fn the_file_and_tephra_variables_set_them_and_tephra_wins_over_paros() {
    let s = Settings::from_toml_str("[journal]\nmax_read_records = 7\n").unwrap();
    assert_eq!(s.journal.max_read_records, 7);
    // Whatever order the environment lists them in.
    for vars in
        [[("PAROS_MAX_WAIT_MS", "100"), ("TEPHRA__JOURNAL__MAX_WAIT_MS", "200")], [("TEPHRA__JOURNAL__MAX_WAIT_MS", "200"), ("PAROS_MAX_WAIT_MS", "100")]]
    {
        assert_eq!(resolve(&vars).unwrap().journal.max_wait_ms, 200);
    }
}

#[test]
fn an_unknown_paros_variable_stops_the_server_naming_the_known_ones() {
    let e = resolve(&[("PAROS_TICK_INTERVAL_MS", "100")]).unwrap_err();
    let text = e.to_string();
    assert!(matches!(e, ConfigError::UnknownParos { .. }), "{text}");
    assert!(text.contains("PAROS_TICK_INTERVAL_MS") && text.contains("PAROS_MAX_READ_RECORDS"), "{text}");
    // A variable that only starts like one is not ours to judge.
    assert!(resolve(&[("PAROSX", "1"), ("PARO_MAX", "1")]).is_ok());
}

#[test]
fn unparsable_and_below_floor_values_are_refused() {
    let e = resolve(&[("PAROS_MAX_READ_RECORDS", "many")]).unwrap_err().to_string();
    assert!(e.contains("PAROS_MAX_READ_RECORDS"), "{e}");
    for var in ["PAROS_MAX_BATCH_RECORDS", "PAROS_MAX_BATCH_BYTES", "PAROS_MAX_READ_RECORDS", "PAROS_MAX_READ_BYTES", "PAROS_ADMISSION_ROUNDS"] {
        let e = resolve(&[(var, "0")]).unwrap_err().to_string();
        assert!(e.contains("journal."), "{var}: {e}");
    }
    let e = resolve(&[("PAROS_MAX_WAIT_MS", "10"), ("PAROS_MIN_WAIT_MS", "20")]).unwrap_err().to_string();
    assert!(e.contains("min_wait_ms"), "{e}");
    assert!(resolve(&[("PAROS_MAX_WAIT_MS", "0")]).is_ok(), "a cap of 0 means reads never wait");
}

#[test]
fn the_journal_segment_size_has_the_event_logs_bounds() {
    assert_eq!(resolve(&[]).unwrap().journal.segment_size, 64 << 20);
    assert_eq!(resolve(&[("TEPHRA__JOURNAL__SEGMENT_SIZE", "65536")]).unwrap().journal.segment_size, 65536);
    for bad in ["64", "0", "99999999999"] {
        let e = resolve(&[("TEPHRA__JOURNAL__SEGMENT_SIZE", bad)]).unwrap_err().to_string();
        assert!(e.contains("journal.segment_size"), "{bad}: {e}");
    }
}
