//! The bad-program table: every `.sir` file under `tests/bad_programs/` is read as bytes, decoded,
//! parsed (which must fail) and its diagnostics snapshotted as a user sees them, under
//! `snapshots/diagnostics/table_NAME.snap`. Add a case by adding a file; refresh with
//! `INSTA_UPDATE=always cargo test -p sinter-ir --test bad_programs` and review every change.

use std::path::Path;

#[test]
fn every_bad_program_is_reported_with_its_place() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/bad_programs");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .expect("the bad-program folder")
        .map(|e| e.expect("a folder entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "sir"))
        .collect();
    files.sort();
    assert!(
        files.len() >= 5,
        "bad programs missing from {}",
        dir.display()
    );
    let mut settings = insta::Settings::clone_current();
    settings.set_snapshot_path(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../snapshots/diagnostics"
    ));
    settings.set_prepend_module_to_snapshot(false);
    settings.set_omit_expression(true);
    for path in files {
        let stem = path.file_stem().unwrap().to_string_lossy().into_owned();
        let bytes = std::fs::read(&path).unwrap();
        let rendered = match sinter_ir::text::decode(&bytes) {
            Err((lossy, diags)) => diags.render("test.sir", &lossy),
            Ok(src) => match sinter_ir::text::parse(src) {
                Ok(g) => panic!("{stem} parsed:\n{}", sinter_ir::text::print(&g)),
                Err(diags) => diags.render("test.sir", src),
            },
        };
        settings.set_description(String::from_utf8_lossy(&bytes).escape_debug().to_string());
        settings.bind(|| insta::assert_snapshot!(format!("table_{stem}"), rendered));
    }
}

/// A byte order mark that starts the file is not part of the program.
#[test]
fn a_leading_byte_order_mark_is_skipped() {
    let src = "\u{feff}graph g {\n  input x: f32[2]\n  y = relu(x)\n  output y\n}\n";
    sinter_ir::text::parse(src).expect("parses");
}
