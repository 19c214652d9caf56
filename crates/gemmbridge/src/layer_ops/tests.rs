//! The problems' rules and the CPU arithmetic against the float64 definitions.

use rand::{Rng, SeedableRng};

use super::*;
use crate::cpu;
use crate::error::Which;
use crate::reference::rel_error;
use half::bf16;

fn rng() -> rand::rngs::StdRng {
    let seed = rand::rng().random::<u64>();
    eprintln!("seed {seed}");
    rand::rngs::StdRng::seed_from_u64(seed)
}

fn values<T: crate::Element>(rng: &mut rand::rngs::StdRng, n: usize) -> Vec<T> {
    (0..n).map(|_| T::from_f64(rng.random_range(-3.0..3.0))).collect()
}

fn what(e: crate::Error) -> &'static str {
    match e {
        crate::Error::LayerOp { what, .. } => what,
        other => panic!("not a LayerOp error: {other}"),
    }
}

#[test]
fn rope_rules_are_named_errors() {
    let ok = Rope::new(2, 7, (8, 1), 64);
    assert!(ok.validate().is_ok());
    assert_eq!(ok.width(), 640);
    assert_eq!(ok.qkv_elems(), 13 * 640 + 640);
    let odd = ok.with_rotary_dim(31).validate().unwrap_err();
    assert!(what(odd).contains("rotary dimension"));
    assert!(ok.with_rotary_dim(66).validate().is_err());
    assert!(ok.with_rotary_dim(0).validate().is_err());
    assert!(Rope::new(1, 1, (4, 1), 1024).validate().is_err(), "rotary dim 1024 > 512");
    assert!(what(ok.with_ld(639).validate().unwrap_err()).contains("leading dimension"));
    assert!(Rope::new(1, 1, (0, 1), 64).validate().is_err());
    assert!(ok.with_theta(0.5, None).validate().is_err());
    assert!(ok.with_theta(f64::NAN, None).validate().is_err());
    let wrong = Llama3Scaling { low_freq_factor: 4.0, high_freq_factor: 1.0, ..Llama3Scaling::LLAMA_3_1 };
    assert!(ok.with_theta(500_000.0, Some(wrong)).validate().is_err());
    assert!(ok.with_theta(500_000.0, Some(Llama3Scaling::LLAMA_3_1)).validate().is_ok());
    assert!(ok.with_tables(0).validate().is_err());
    assert!(ok.check_call(true).is_err() && ok.with_tables(9).check_call(false).is_err());
    // positions: contiguous past the limit, given out of range or too few
    assert!(ok.check_start(MAX_POSITION - 7).is_ok() && ok.check_start(MAX_POSITION - 6).is_err());
    assert!(ok.with_tables(10).check_start(3).is_ok() && ok.with_tables(10).check_start(4).is_err());
    assert!(ok.check_positions(&[0; 14]).is_ok());
    assert!(matches!(
        ok.check_positions(&[0; 13]),
        Err(crate::Error::BufferTooSmall { operand: Which::LayerOp("positions"), .. })
    ));
    let mut p = [5i32; 14];
    p[9] = -1;
    assert!(what(ok.check_positions(&p).unwrap_err()).contains("position"));
}

#[test]
fn a_rope_buffer_past_isize_max_is_refused_with_exact_numbers() {
    // 2³¹ − 1 sequences of 2³⁰ tokens, rows of 6 elements: about 1.4·10¹⁹ elements
    let huge = Rope::new(i32::MAX as usize, 1 << 30, (1, 1), 2);
    let e = huge.validate().unwrap_err();
    let text = e.to_string();
    assert!(what(e).contains("not addressable"), "{text}");
    assert!(text.contains(&format!("({} − 1)·6 + 6 elements", (i32::MAX as usize) << 30)), "{text}");
    assert!(!text.contains(&usize::MAX.to_string()), "a saturated count: {text}");
    let mut x = vec![bf16::ZERO; 6];
    let e = cpu::rope(&huge, RopeDirection::Forward, &mut x, Positions::Contiguous { start: 0 }, None).unwrap_err();
    assert!(matches!(e, crate::Error::LayerOp { .. }), "{e}");
    // rows of 6 elements, 2³⁰ tokens per sequence: the most sequences whose f32 extent 6·b·s·4
    // bytes is at most isize::MAX pass, one more is refused
    let most = isize::MAX as usize / 4 / 6 / (1 << 30);
    assert!(Rope::new(most, 1 << 30, (1, 1), 2).validate().is_ok());
    assert!(Rope::new(most + 1, 1 << 30, (1, 1), 2).validate().is_err());
}

#[test]
fn swiglu_rules_are_named_errors() {
    let op = SwiGlu::new(7, 11, GluLayout::Halves);
    assert!(op.validate().is_ok());
    assert_eq!((op.in_elems(), op.out_elems()), (6 * 22 + 22, 6 * 11 + 11));
    assert!(op.with_ld(21, 11).validate().is_err() && op.with_ld(22, 10).validate().is_err());
    assert_eq!(SwiGlu::new(0, 11, GluLayout::Halves).in_elems(), 0);
    assert_eq!(op.gate_up_index(1, 3), (25, 36));
    assert_eq!(SwiGlu::new(7, 11, GluLayout::Interleaved).gate_up_index(1, 3), (28, 29));
    let mut y = vec![bf16::ZERO; 76];
    let e = cpu::swiglu(&op, &[bf16::ZERO; 153], &mut y).unwrap_err();
    assert!(matches!(e, crate::Error::BufferTooSmall { operand: Which::LayerOp("gate/up"), .. }), "{e}");
    // every size at most 2³¹ − 1, but (rows − 1)·ld_in + 2·f ≈ 2⁶² elements: 2⁶⁴ f32 bytes
    let big = SwiGlu::new(MAX_SIZE, 1 << 29, GluLayout::Halves).with_ld(MAX_SIZE, 1 << 29);
    let e = big.validate().unwrap_err();
    let text = e.to_string();
    assert!(what(e).contains("not addressable"), "{text}");
    assert!(text.contains(&format!("gate/up: ({MAX_SIZE} − 1)·{MAX_SIZE} + {} elements", 1 << 30)), "{text}");
    // an extent of at most isize::MAX / 4 elements passes
    assert!(SwiGlu::new(1 << 30, 1 << 29, GluLayout::Halves).validate().is_ok());
}

/// Every shape of RoPE on the CPU against float64, forward and backward, both styles, partial
/// rotary, θ (with and without LLaMA 3's scaling) and tables, contiguous and given positions;
/// everything not rotated unchanged.
#[test]
fn cpu_rope_is_near_float64_and_leaves_the_rest() {
    let mut rng = rng();
    let tabled = |op: Rope| op.with_tables(300);
    for (style, rd, angles) in [
        (RopeStyle::RotateHalf, 64, 0),
        (RopeStyle::Interleaved, 64, 0),
        (RopeStyle::RotateHalf, 24, 1),
        (RopeStyle::Interleaved, 40, 2),
    ] {
        let base = Rope::new(2, 9, (4, 2), 64).with_style(style).with_rotary_dim(rd).with_ld(8 * 64 + 5);
        let op = match angles {
            0 => base,
            1 => base.with_theta(500_000.0, Some(Llama3Scaling::LLAMA_3_1)),
            _ => tabled(base),
        };
        let tables: (Vec<f32>, Vec<f32>) =
            (0..op.table_elems()).map(|k| ((k as f32 * 0.37).cos(), (k as f32 * 0.37).sin())).unzip();
        let tb = RopeTables { cos: &tables.0[..], sin: &tables.1[..] };
        let given: Vec<i32> = (0..op.tokens()).map(|_| rng.random_range(0..300)).collect();
        for positions in [Positions::Contiguous { start: 250 }, Positions::Given(&given[..])] {
            for dir in [RopeDirection::Forward, RopeDirection::Backward] {
                let x: Vec<f32> = values(&mut rng, op.qkv_elems());
                let mut got = x.clone();
                let t = (angles == 2).then_some(tb);
                cpu::rope(&op, dir, &mut got, positions, t).unwrap();
                let wide: Vec<f64> = x.iter().map(|&v| v as f64).collect();
                let want = reference::rope(&op, dir, &wide, &positions, t.as_ref());
                let got64: Vec<f64> = got.iter().map(|&v| v as f64).collect();
                let err = rel_error(&got64, &want);
                assert!(err < 1e-6, "{} {dir:?}: rel error {err:e}", op.describe());
                // untouched: v heads, partial-rotary tails, padding (the reference copies them)
                let changed = (0..x.len()).filter(|&k| got[k] != x[k]).count();
                let rotated = op.tokens() * 6 * rd;
                assert!(changed <= rotated, "{changed} changed, at most {rotated}");
                for k in 0..x.len() {
                    if want[k] == wide[k] && (k % op.ld >= 6 * 64 || k % 64 >= rd) {
                        assert_eq!(got[k].to_bits(), x[k].to_bits(), "element {k} changed");
                    }
                }
            }
        }
    }
}

/// The backward undoes the forward (to f32 rounding), in bf16 within its band.
#[test]
fn rope_backward_inverts_the_forward() {
    let mut rng = rng();
    let op = Rope::new(1, 33, (8, 1), 128).with_theta(500_000.0, None);
    let x: Vec<bf16> = values(&mut rng, op.qkv_elems());
    let mut y = x.clone();
    let at = Positions::Contiguous { start: 1000 };
    cpu::rope(&op, RopeDirection::Forward, &mut y, at, None).unwrap();
    assert!(y != x);
    cpu::rope(&op, RopeDirection::Backward, &mut y, at, None).unwrap();
    let (a, b): (Vec<f64>, Vec<f64>) = x.iter().zip(&y).map(|(p, q)| (p.to_f64(), q.to_f64())).unzip();
    assert!(rel_error(&b, &a) < 1e-2);
}

#[test]
fn cpu_rope_refuses_bad_calls_and_writes_nothing() {
    let op = Rope::new(1, 4, (2, 1), 16);
    let x = vec![1.5f32; op.qkv_elems()];
    let mut y = x.clone();
    let bad = Positions::Given(&[0, 1, 1 << 24, 2][..]);
    assert!(cpu::rope(&op, RopeDirection::Forward, &mut y, bad, None).is_err());
    let short = [0f32; 7];
    let t = RopeTables { cos: &short[..], sin: &short[..] };
    let tabled = op.with_tables(2);
    let e = cpu::rope(&tabled, RopeDirection::Forward, &mut y, Positions::Contiguous { start: 0 }, Some(t));
    assert!(matches!(e, Err(crate::Error::BufferTooSmall { operand: Which::LayerOp("cos table"), .. })), "{e:?}");
    assert_eq!(y, x);
}

/// SwiGLU forward and backward on the CPU against float64, both layouts, padded rows, with
/// large and special gate values; padding untouched.
#[test]
fn cpu_swiglu_is_near_float64() {
    let mut rng = rng();
    for layout in [GluLayout::Halves, GluLayout::Interleaved] {
        let op = SwiGlu::new(13, 37, layout).with_ld(80, 41);
        let mut gu: Vec<f32> = (0..op.in_elems()).map(|_| rng.random_range(-12.0..12.0)).collect();
        gu[0] = 95.0;
        gu[2] = -95.0;
        let dy: Vec<f32> = values(&mut rng, op.out_elems());
        let mut y = vec![f32::NAN; op.out_elems()];
        cpu::swiglu(&op, &gu, &mut y).unwrap();
        let wide = |v: &[f32]| v.iter().map(|&x| x as f64).collect::<Vec<_>>();
        let want = reference::swiglu(&op, &wide(&gu));
        let got: Vec<f64> = (0..op.rows * op.f).map(|k| y[(k / op.f) * op.ld_out + k % op.f] as f64).collect();
        assert!(rel_error(&got, &want) < 1e-6, "{}", op.describe());
        assert!(y[37..41].iter().all(|v| v.is_nan()), "padding written");
        let mut dgu = vec![f32::NAN; op.in_elems()];
        cpu::swiglu_backward(&op, &dy, &gu, &mut dgu).unwrap();
        let (wdg, wdu) = reference::swiglu_backward(&op, &wide(&dy), &wide(&gu));
        let pick = |gate: bool| -> Vec<f64> {
            (0..op.rows * op.f)
                .map(|k| {
                    let (g, u) = op.gate_up_index(k / op.f, k % op.f);
                    dgu[if gate { g } else { u }] as f64
                })
                .collect()
        };
        assert!(rel_error(&pick(true), &wdg) < 1e-6 && rel_error(&pick(false), &wdu) < 1e-6);
        assert!(dgu[74..80].iter().all(|v| v.is_nan()), "padding written");
    }
}

/// The f32 angle `p·inv_freq` (the problem's definition, as Hugging Face's) against exact
/// float64 angles at long-context positions: within the bf16 band up to 2¹⁷ (128k tokens).
#[test]
fn f32_angles_stay_within_the_half_precision_band_at_long_contexts() {
    let mut rng = rng();
    let op = Rope::new(1, 64, (4, 1), 128).with_theta(500_000.0, Some(Llama3Scaling::LLAMA_3_1));
    let x: Vec<f32> = values(&mut rng, op.qkv_elems());
    let mut got = x.clone();
    let at = Positions::Contiguous { start: (1 << 17) - 64 };
    cpu::rope(&op, RopeDirection::Forward, &mut got, at, None).unwrap();
    let f = op.inv_freqs();
    let mut want: Vec<f64> = x.iter().map(|&v| v as f64).collect();
    for t in 0..64 {
        for i in 0..64 {
            let a = ((1 << 17) - 64 + t) as f64 * f[i] as f64;
            let (c, s) = (a.cos(), a.sin());
            for h in 0..5 {
                let b = t * op.ld + h * 128;
                let (x1, x2) = (x[b + i] as f64, x[b + i + 64] as f64);
                (want[b + i], want[b + i + 64]) = (x1 * c - x2 * s, x2 * c + x1 * s);
            }
        }
    }
    let got: Vec<f64> = got.iter().map(|&v| v as f64).collect();
    let err = rel_error(&got, &want);
    eprintln!("f32 angles at positions near 2^17: rel error {err:e} against exact angles");
    assert!(err < 1e-2, "{err:e}");
}

/// The byte count of a problem with more heads than usize holds is a number, not an overflow.
#[test]
fn rope_bytes_moved_does_not_overflow_on_huge_head_counts() {
    let r = Rope::new(1, 1, (usize::MAX, 1), 2);
    assert!(r.validate().is_err());
    let bytes = r.bytes_moved(2);
    assert!(bytes.is_finite() && bytes > 1e19, "{bytes}");
}
