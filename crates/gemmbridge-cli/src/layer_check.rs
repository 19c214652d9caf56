//! `gemmbridge layer-check --out DIR`: the file `bench/layer_peer.py --check DIR` compares
//! against — a small decoder layer's inputs, its float64 reference's output and gradients,
//! and, where the GPU layer runs, the GPU's (`gemmbridge::layer` documents the tensor names).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use anyhow::Context;
use gemmbridge::cuda::layer::{to_host, GpuDecoderLayer};
use gemmbridge::cuda::Gpu;
use gemmbridge::half::bf16;
use gemmbridge::layer::reference::{backward, forward, Grads, Weights};
use gemmbridge::layer::{check_names, DecoderLayer, LayerWeight, Tokens, CHECK_FILE};
use gemmbridge::DType;
use safetensors::tensor::TensorView;
use safetensors::Dtype;

use crate::bench::decoder::synthetic_weights;
use crate::random::normal;

/// The check file's format name (its metadata's `format`).
const FORMAT: &str = "gemmbridge-layer-check-1";

#[derive(clap::Args)]
pub struct Args {
    /// Folder to write layer_check.safetensors into (created if missing). Checked before any
    /// work: a path that is not a folder, or a folder the file cannot be written in, is an
    /// error.
    #[arg(long)]
    out: PathBuf,
}

/// The check size: odd where it may be (d 320, 5 query heads over 1 of 64, ffn 864, b 2, s 37).
fn check_size() -> (DecoderLayer, Tokens) {
    (DecoderLayer::new(320, (5, 1), 64, 864, DType::BF16), Tokens { b: 2, s: 37 })
}

/// One tensor of the file: its dtype, shape and little-endian bytes.
struct Entry(Dtype, Vec<usize>, Vec<u8>);

fn bf16s(v: &[f64], shape: Vec<usize>) -> Entry {
    Entry(Dtype::BF16, shape, v.iter().flat_map(|&x| bf16::from_f64(x).to_le_bytes()).collect())
}

fn f64s(v: &[f64], shape: Vec<usize>) -> Entry {
    Entry(Dtype::F64, shape, v.iter().flat_map(|x| x.to_le_bytes()).collect())
}

fn f32s(v: &[f64], shape: Vec<usize>) -> Entry {
    Entry(Dtype::F32, shape, v.iter().flat_map(|&x| (x as f32).to_le_bytes()).collect())
}

/// The shape of a result by its name (`y`, `dx`: `[b, s, d]`; `d_<weight>`: the weight's).
fn result_shape(l: &DecoderLayer, t: Tokens, name: &str) -> Vec<usize> {
    match LayerWeight::ALL.into_iter().find(|w| name.strip_prefix("d_") == Some(w.name())) {
        Some(LayerWeight::Norm1 | LayerWeight::Norm2) => vec![l.d_model],
        Some(w) => l.weight_shape(w).to_vec(),
        None => vec![t.b, t.s, l.d_model],
    }
}

/// The GPU layer's output and gradients on the same inputs, or why it could not give them.
fn ours(l: DecoderLayer, t: Tokens, w: &Weights, x: &[f64], dy: &[f64]) -> anyhow::Result<(Vec<f64>, Grads)> {
    let gpu = Gpu::new(0)?;
    let mut layer = GpuDecoderLayer::<bf16>::new(&gpu, l, t, w)?;
    let s = gpu.stream();
    let up = |v: &[f64]| s.clone_htod(&v.iter().map(|&x| bf16::from_f64(x)).collect::<Vec<_>>());
    let (dx_in, ddy) = (up(x)?, up(dy)?);
    layer.forward(&gpu, &dx_in, true)?;
    layer.backward(&gpu, &dx_in, &ddy)?;
    let y = to_host(&gpu, layer.output())?;
    let g = Grads { dx: to_host(&gpu, layer.input_grad())?, dw: layer.grads_to_host(&gpu)? };
    Ok((y, g))
}

/// The file to write in `dir`, checked before anything is computed: `dir` is created if
/// missing, and the file can be written there (an existing one is left as it is until the
/// write replaces it).
///
/// # Errors
/// `dir` cannot be created as a folder (a file of that name, a missing permission), or the
/// file in it cannot be opened for writing; each names the path and the OS error.
fn check_out(dir: &Path) -> anyhow::Result<PathBuf> {
    std::fs::create_dir_all(dir).with_context(|| format!("--out {}: cannot create the folder", dir.display()))?;
    let path = dir.join(CHECK_FILE);
    let cannot = || format!("--out {}: cannot write {}", dir.display(), path.display());
    if path.exists() {
        std::fs::OpenOptions::new().write(true).open(&path).with_context(cannot)?;
    } else {
        std::fs::File::create(&path).with_context(cannot)?;
        std::fs::remove_file(&path).with_context(cannot)?;
    }
    Ok(path)
}

pub fn run(args: Args) -> anyhow::Result<i32> {
    let path = check_out(&args.out)?;
    let (l, t) = check_size();
    let rounded = |v: Vec<bf16>| v.iter().map(|x| x.to_f64()).collect::<Vec<f64>>();
    let n = t.count() * l.d_model;
    let (x, dy) = (rounded(normal::<bf16>(n)), rounded(normal::<bf16>(n)));
    // the bench's weights (a hash of each place), plus noise on the norms, rounded to bf16
    let base = synthetic_weights(&l)?;
    let noise = rounded(normal::<bf16>(2 * l.d_model));
    let w = Weights::from_fn(&l, |which, i| {
        let v = match which {
            LayerWeight::Norm1 => 1.0 + 0.1 * noise[i],
            LayerWeight::Norm2 => 1.0 + 0.1 * noise[l.d_model + i],
            _ => base.get(which)[i],
        };
        bf16::from_f64(v).to_f64()
    })?;
    let saved = forward(&l, t, &w, &x)?;
    let want = backward(&l, t, &w, &x, &saved, &dy)?;
    let mut entries: Vec<(String, Entry)> =
        vec![("x".into(), bf16s(&x, vec![t.b, t.s, l.d_model])), ("dy".into(), bf16s(&dy, vec![t.b, t.s, l.d_model]))];
    for which in LayerWeight::ALL {
        let shape = if matches!(which, LayerWeight::Norm1 | LayerWeight::Norm2) {
            vec![l.d_model]
        } else {
            l.weight_shape(which).to_vec()
        };
        entries.push((which.name().into(), bf16s(w.get(which), shape)));
    }
    let result =
        |name: &str, y: &[f64], g: &Grads| if name == "y" { y.to_vec() } else { g.named(name).unwrap_or(&[]).to_vec() };
    for name in check_names() {
        entries.push((format!("ref64.{name}"), f64s(&result(&name, &saved.y, &want), result_shape(&l, t, &name))));
    }
    let status = match ours(l, t, &w, &x, &dy) {
        Ok((y, g)) => {
            for name in check_names() {
                entries.push((format!("ours.{name}"), f32s(&result(&name, &y, &g), result_shape(&l, t, &name))));
            }
            "present".to_string()
        }
        Err(e) => {
            eprintln!("the GPU layer did not run, so the file holds no ours.* tensors: {e:#}");
            format!("absent: {e:#}")
        }
    };
    write(&path, &l, t, &status, &entries)?;
    Ok(0)
}

/// Writes the entries to `path` ([`check_out`]) with the layer's sizes as metadata.
fn write(path: &Path, l: &DecoderLayer, t: Tokens, ours: &str, entries: &[(String, Entry)]) -> anyhow::Result<()> {
    let meta: HashMap<String, String> = [
        ("format", FORMAT.to_string()),
        ("d_model", l.d_model.to_string()),
        ("heads_q", l.heads_q.to_string()),
        ("heads_kv", l.heads_kv.to_string()),
        ("head_dim", l.head_dim.to_string()),
        ("ffn", l.ffn.to_string()),
        ("eps", format!("{:e}", l.eps)),
        ("rope_theta", l.rope_theta.to_string()),
        ("rope", l.rope.name().to_string()),
        ("dtype", l.dtype.to_string()),
        ("b", t.b.to_string()),
        ("s", t.s.to_string()),
        ("ours", ours.to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    let mut views = Vec::with_capacity(entries.len());
    for (name, Entry(dtype, shape, bytes)) in entries {
        views.push((name.clone(), TensorView::new(*dtype, shape.clone(), bytes)?));
    }
    safetensors::serialize_to_file(views, Some(meta), path).with_context(|| format!("writing {}", path.display()))?;
    eprintln!("wrote {} ({} tensors; ours {ours})", path.display(), entries.len());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::check_out;

    #[test]
    fn the_output_folder_is_checked_before_any_work() {
        let dir = std::env::temp_dir().join(format!("gemmbridge-layer-check-out-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        // a missing folder is created, and nothing is left in it
        let fresh = dir.join("a/b");
        assert_eq!(check_out(&fresh).unwrap(), fresh.join(super::CHECK_FILE));
        assert_eq!(std::fs::read_dir(&fresh).unwrap().count(), 0);
        // a file where the folder should be
        let file = dir.join("file");
        std::fs::write(&file, "x").unwrap();
        let e = format!("{:#}", check_out(&file).unwrap_err());
        assert!(e.starts_with(&format!("--out {}: cannot create the folder: ", file.display())), "{e}");
        assert!(e.contains("os error"), "{e}");
        // a folder where the file should be
        let taken = dir.join("taken");
        std::fs::create_dir_all(taken.join(super::CHECK_FILE)).unwrap();
        let e = format!("{:#}", check_out(&taken).unwrap_err());
        assert!(e.starts_with(&format!("--out {}: cannot write ", taken.display())), "{e}");
        assert!(e.contains("os error 21"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
