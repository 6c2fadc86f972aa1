//! `sinter inspect FILE.sart [--kernel NAME_OR_INDEX] [--json]`: what an artifact holds: its
//! kernels (and the source ops each covers), the arena map, the dispatches and the I/O manifest;
//! or one kernel's WGSL.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use serde_json::{Value, json};
use sinter_ir::artifact::{Artifact, FORMAT_VERSION, Kernel, Role, TensorSlot};

use crate::error::CliError;
use crate::{artifact, console, units};

#[derive(clap::Args)]
pub struct Args {
    /// The compiled artifact (from `sinter compile`).
    file: PathBuf,
    /// Print one kernel's WGSL: its index (as listed) or its name.
    #[arg(short, long, value_name = "NAME_OR_INDEX")]
    kernel: Option<String>,
    /// Print JSON instead: `{"kernels": [{"name", "pattern", "ops", …}], "arena_bytes",
    /// "dispatches", …}`, or with --kernel that kernel as an object.
    #[arg(long)]
    json: bool,
}

pub fn run(args: &Args) -> Result<(), CliError> {
    let artifact = artifact::read(&args.file)?;
    let text = match &args.kernel {
        Some(wanted) => {
            let index = find_kernel(&artifact, wanted, &args.file)?;
            if args.json {
                json_text(&kernel_json(&artifact, index, true))
            } else {
                let mut wgsl = artifact.kernels[index].wgsl.clone();
                if !wgsl.ends_with('\n') {
                    wgsl.push('\n');
                }
                wgsl
            }
        }
        None if args.json => json_text(&artifact_json(&artifact)),
        None => listing(&artifact, &args.file),
    };
    console::print(&text)
}

fn find_kernel(artifact: &Artifact, wanted: &str, file: &Path) -> Result<usize, CliError> {
    let count = artifact.kernels.len();
    if let Ok(index) = wanted.parse::<usize>() {
        return if index < count {
            Ok(index)
        } else {
            Err(CliError::Arg(format!(
                "kernel index {index} is out of range: {} has {count} kernel{}{}",
                file.display(),
                if count == 1 { "" } else { "s" },
                if count == 0 {
                    String::new()
                } else {
                    format!(" (0..={})", count - 1)
                }
            )))
        };
    }
    artifact
        .kernels
        .iter()
        .position(|k| k.name == wanted)
        .ok_or_else(|| {
            let names: Vec<&str> = artifact.kernels.iter().map(|k| k.name.as_str()).collect();
            CliError::Arg(format!(
                "{} has no kernel named `{wanted}`; its kernels are {}",
                file.display(),
                if names.is_empty() {
                    "(none)".to_string()
                } else {
                    names.join(", ")
                }
            ))
        })
}

fn dispatch_count(artifact: &Artifact, kernel: usize) -> usize {
    artifact
        .dispatches
        .iter()
        .filter(|d| d.kernel as usize == kernel)
        .count()
}

fn role_name(role: Role) -> &'static str {
    match role {
        Role::Input => "input",
        Role::Output => "output",
        Role::Param => "param",
        Role::State => "state",
    }
}

// ---------------------------------------------------------------------------------------------
// JSON

fn json_text(value: &Value) -> String {
    let mut text = serde_json::to_string_pretty(value).expect("JSON values serialize");
    text.push('\n');
    text
}

fn kernel_json(artifact: &Artifact, index: usize, with_wgsl: bool) -> Value {
    let k: &Kernel = &artifact.kernels[index];
    let mut value = json!({
        "index": index,
        "name": k.name,
        "pattern": k.pattern,
        "ops": k.ops,
        "dispatches": dispatch_count(artifact, index),
        "entry_point": k.entry_point,
        "workgroup_size": k.workgroup_size,
        "arena_bindings": k.arena_bindings,
        "loops_bounded": k.loops_bounded,
        "indices_in_range": k.indices_in_range,
        "rules": k.rules,
    });
    if with_wgsl {
        value["wgsl"] = json!(k.wgsl);
    }
    value
}

fn artifact_json(artifact: &Artifact) -> Value {
    let memory = &artifact.memory;
    let kernels: Vec<Value> = (0..artifact.kernels.len())
        .map(|i| kernel_json(artifact, i, false))
        .collect();
    let tensors: Vec<Value> = artifact
        .tensors
        .iter()
        .map(|t| {
            json!({
                "name": t.name,
                "role": role_name(t.role),
                "type": t.ty.to_string(),
                "dtype": t.ty.dtype.to_string(),
                "shape": t.ty.shape,
                "arena": t.arena,
                "offset": t.offset,
                "size_bytes": t.size_bytes(),
                "initial_value": initial_value(t),
            })
        })
        .collect();
    json!({
        "graph": artifact.graph,
        "format_version": FORMAT_VERSION,
        "initial_value_bytes": artifact.blob.len(),
        "kernels": kernels,
        "arena_bytes": memory.peak_bytes,
        "lower_bound_bytes": memory.lower_bound_bytes,
        "arenas": artifact.arenas.iter().map(|a| a.size_bytes).collect::<Vec<_>>(),
        "dispatches": artifact.dispatches.len(),
        "buffers": memory.buffers,
        "tensors": tensors,
        "assigns": artifact.assigns,
        "updated_in_place": artifact.updated_in_place,
        "requirements": artifact.requirements,
        "optimizer": artifact.optimizer,
        "generation": artifact.generation.as_ref().map(|g| json!({
            "info": g.info,
            "prefill": artifact_json(&g.prefill),
        })),
    })
}

// ---------------------------------------------------------------------------------------------
// the human listing

/// Column alignment for [`table`].
#[derive(Clone, Copy)]
enum Align {
    Left,
    Right,
}

/// Rows under a header, columns padded to their widest cell, indented by two spaces; the last
/// column is not padded.
fn table(header: &[(&str, Align)], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|(h, _)| h.chars().count()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let heading: Vec<String> = header.iter().map(|(h, _)| h.to_string()).collect();
    for row in std::iter::once(&heading).chain(rows) {
        let mut line = String::from(" ");
        for (i, cell) in row.iter().enumerate() {
            let (w, align) = (widths[i], header[i].1);
            let last = i + 1 == row.len();
            line.push(' ');
            match align {
                Align::Left if last => line.push_str(cell),
                Align::Left => line.push_str(&format!("{cell:<w$}")),
                Align::Right => line.push_str(&format!("{cell:>w$}")),
            }
            line.push(' ');
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// A tensor's initial value as the file holds it: an initializer the runtime evaluates at load,
/// bytes in the blob, or nothing (inputs and outputs).
fn initial_value(t: &TensorSlot) -> String {
    match (&t.fill, t.init) {
        (Some(fill), _) => fill.to_string(),
        (None, Some((_, len))) => format!("{} in the file", units::bytes(len)),
        (None, None) => "-".to_string(),
    }
}

/// What the file's bytes are: the manifest's kernels (WGSL), dispatches (param words) and the
/// rest, and the initial values stored as bytes; and how many values the runtime generates.
fn file_contents(artifact: &Artifact, file: &Path) -> String {
    let file_bytes = std::fs::metadata(file).map_or(0, |m| m.len());
    // bytes as the manifest's JSON writes them
    let kernels = serde_json::to_vec(&artifact.kernels).map_or(0, |b| b.len() as u64);
    let dispatches = serde_json::to_vec(&artifact.dispatches).map_or(0, |b| b.len() as u64);
    let blob = artifact.blob.len() as u64;
    let rest = file_bytes.saturating_sub(kernels + dispatches + blob);
    let generated: usize = artifact
        .tensors
        .iter()
        .filter(|t| t.fill.is_some())
        .map(|t| t.ty.numel())
        .sum();
    let initializers = artifact.tensors.iter().filter(|t| t.fill.is_some()).count();
    format!(
        "\nfile: {} = kernels' WGSL and metadata {} ({} kernels) + dispatches {} ({}) + the rest of \
         the manifest {} + initial values as bytes {}; {} values from {} initializers are \
         generated at load\n",
        units::bytes(file_bytes),
        units::bytes(kernels),
        artifact.kernels.len(),
        units::bytes(dispatches),
        artifact.dispatches.len(),
        units::bytes(rest),
        units::bytes(blob),
        generated,
        initializers,
    )
}

fn listing(artifact: &Artifact, file: &Path) -> String {
    use Align::{Left, Right};
    let mut s = String::new();
    let memory = &artifact.memory;
    let _ = writeln!(
        s,
        "{}: graph `{}`, artifact format version {FORMAT_VERSION}",
        file.display(),
        artifact.graph
    );

    s.push_str(&file_contents(artifact, file));

    let r = &artifact.requirements;
    let features = if r.features.is_empty() {
        "none".to_string()
    } else {
        r.features.join(", ")
    };
    let _ = writeln!(s, "\nrequirements: features {features}");
    let limits = r.limits();
    let rows: Vec<Vec<String>> = limits
        .iter()
        .map(|(name, v)| vec![name.to_string(), v.to_string()])
        .collect();
    s.push_str(&table(&[("limit", Left), ("at least", Right)], &rows));

    match &artifact.optimizer {
        Some(o) => {
            let _ = writeln!(s, "\noptimizer: {:.1} ms", o.ms);
            let rows: Vec<Vec<String>> = [("before", &o.before), ("after", &o.after)]
                .iter()
                .map(|(when, st)| {
                    vec![
                        when.to_string(),
                        st.dispatches.to_string(),
                        units::bytes(st.bytes_moved),
                        format!("{:.1} us", st.estimated_us),
                    ]
                })
                .collect();
            s.push_str(&table(
                &[
                    ("", Left),
                    ("dispatches", Right),
                    ("bytes moved", Right),
                    ("estimated time", Right),
                ],
                &rows,
            ));
            for set in &o.rule_sets {
                let applied: Vec<String> = set
                    .applied
                    .iter()
                    .filter(|(_, n)| *n > 0)
                    .map(|(r, n)| format!("{r} x{n}"))
                    .collect();
                let _ = writeln!(
                    s,
                    "  {}: {} iterations, {}, {} e-nodes, {} e-classes, {:.1} ms; {}",
                    set.name,
                    set.iterations,
                    set.stop,
                    set.e_nodes,
                    set.e_classes,
                    set.ms,
                    if applied.is_empty() {
                        "no rule applied".to_string()
                    } else {
                        applied.join(", ")
                    }
                );
            }
        }
        None => {
            let _ = writeln!(s, "\noptimizer: not run (--no-opt)");
        }
    }

    let _ = writeln!(s, "\nkernels: {}", artifact.kernels.len());
    let rows: Vec<Vec<String>> = artifact
        .kernels
        .iter()
        .enumerate()
        .map(|(i, k)| {
            vec![
                i.to_string(),
                k.name.clone(),
                k.pattern.clone(),
                dispatch_count(artifact, i).to_string(),
                k.rules.join(", "),
                k.ops.join("; "),
            ]
        })
        .collect();
    s.push_str(&table(
        &[
            ("#", Right),
            ("name", Left),
            ("pattern", Left),
            ("dispatches", Right),
            ("rules", Left),
            ("source ops", Left),
        ],
        &rows,
    ));

    let arenas: Vec<String> = artifact
        .arenas
        .iter()
        .enumerate()
        .map(|(i, a)| format!("arena {i}: {} bytes", a.size_bytes))
        .collect();
    let _ = writeln!(
        s,
        "\narena map: peak {} bytes ({}), lower bound {} bytes ({}), peak/lower bound {}",
        memory.peak_bytes,
        units::bytes(memory.peak_bytes),
        memory.lower_bound_bytes,
        units::bytes(memory.lower_bound_bytes),
        units::ratio(memory.peak_bytes, memory.lower_bound_bytes),
    );
    let _ = writeln!(s, "  {}", arenas.join(", "));
    let mut buffers: Vec<_> = memory.buffers.iter().collect();
    buffers.sort_by_key(|b| (b.arena, b.offset, b.live));
    let rows: Vec<Vec<String>> = buffers
        .iter()
        .map(|b| {
            vec![
                b.arena.to_string(),
                b.offset.to_string(),
                b.size_bytes.to_string(),
                format!("{}..={}", b.live.0, b.live.1),
                b.label.clone(),
            ]
        })
        .collect();
    s.push_str(&table(
        &[
            ("arena", Right),
            ("offset", Right),
            ("bytes", Right),
            ("live", Right),
            ("label", Left),
        ],
        &rows,
    ));

    let _ = writeln!(s, "\ndispatches: {}", artifact.dispatches.len());

    let _ = writeln!(s, "\ntensors: {}", artifact.tensors.len());
    let rows: Vec<Vec<String>> = artifact
        .tensors
        .iter()
        .map(|t| {
            vec![
                role_name(t.role).to_string(),
                t.name.clone(),
                t.ty.to_string(),
                t.arena.to_string(),
                t.offset.to_string(),
                initial_value(t),
            ]
        })
        .collect();
    s.push_str(&table(
        &[
            ("role", Left),
            ("name", Left),
            ("type", Left),
            ("arena", Right),
            ("offset", Right),
            ("initial value", Left),
        ],
        &rows,
    ));

    if !artifact.assigns.is_empty() {
        let _ = writeln!(s, "\nassigns after each run: {}", artifact.assigns.len());
        let rows: Vec<Vec<String>> = artifact
            .assigns
            .iter()
            .map(|a| {
                vec![
                    a.target.clone(),
                    format!("{} @ {}", a.source_arena, a.source_offset),
                    format!("{} @ {}", a.target_arena, a.target_offset),
                    a.bytes.to_string(),
                ]
            })
            .collect();
        s.push_str(&table(
            &[
                ("target", Left),
                ("from arena @ offset", Right),
                ("to arena @ offset", Right),
                ("bytes", Right),
            ],
            &rows,
        ));
    }
    if !artifact.updated_in_place.is_empty() {
        let _ = writeln!(
            s,
            "\nupdated in place (a kernel writes the new value over the old): {}\n  {}",
            artifact.updated_in_place.len(),
            artifact.updated_in_place.join(", ")
        );
    }
    if let Some(g) = &artifact.generation {
        let (i, p) = (&g.info, &g.prefill);
        let _ = writeln!(
            s,
            "\ngeneration: this is the one-token step of `{}` (context {}, batch {}, vocabulary \
             {}); beside it the prefill program `{}` ({} tokens: {} kernels, {} dispatches, arena \
             {}); ids `{}`, logits `{}`, step position `{}`, prefill last position `{}`; caches: \
             {}",
            artifact.graph.trim_end_matches("_step"),
            i.context,
            i.batch,
            i.vocab,
            p.graph,
            i.prefill,
            p.kernels.len(),
            p.dispatches.len(),
            crate::units::bytes(p.memory.peak_bytes),
            i.ids,
            i.logits,
            i.position,
            i.last,
            i.caches.join(", ")
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_align_columns() {
        let rows = vec![
            vec!["0".to_string(), "k0_matmul".to_string(), "a; b".to_string()],
            vec!["10".to_string(), "k10".to_string(), "c".to_string()],
        ];
        let t = table(
            &[
                ("#", Align::Right),
                ("name", Align::Left),
                ("ops", Align::Left),
            ],
            &rows,
        );
        assert_eq!(
            t,
            "   #  name       ops\n   0  k0_matmul  a; b\n  10  k10        c\n"
        );
    }
}
