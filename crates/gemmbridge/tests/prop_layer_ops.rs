//! Property tests of RoPE ([`Rope`]: batch, sequence, heads, rotary dimension, style, angles
//! from θ (with LLaMA 3 scaling) or from tables, leading dimension, positions) and SwiGLU
//! ([`SwiGlu`]: rows, width, layout, leading dimensions), and of the CPU backend's `rope`,
//! `swiglu` and `swiglu_backward` on every problem small enough to run: nothing panics or
//! overflows, buffers too small are refused, and finite inputs give finite outputs.

#[path = "prop/mod.rs"]
mod shared;

use gemmbridge::cpu;
use gemmbridge::layer_ops::{GluLayout, Llama3Scaling, Positions, Rope, RopeDirection, RopeStyle, RopeTables, SwiGlu};
use gemmbridge::Element;
use proptest::prelude::*;
use shared::{config, dtype, size, size_multiple, RUN_ELEMS, RUN_WORK};

fn dim() -> impl Strategy<Value = usize> {
    prop_oneof![3 => 1usize..=3, 1 => size()]
}

fn float() -> impl Strategy<Value = f64> {
    prop_oneof![3 => 0.5f64..20_000.0, 1 => any::<f64>(), 1 => Just(f64::NAN), 1 => Just(f64::INFINITY), 1 => Just(0.0)]
}

prop_compose! {
    fn rope()(batch in dim(), seq in dim(), heads in (dim(), dim()), head_dim in prop_oneof![size_multiple(2), size()],
              rotary in prop::option::of(size_multiple(2)), interleaved in any::<bool>(),
              angles in prop_oneof![
                  (float(), prop::option::of((float(), float(), float(), size()))).prop_map(|(t, l)| (Some((t, l)), 0)),
                  prop_oneof![1usize..=16, size()].prop_map(|m| (None, m))
              ],
              ld in prop::option::of(prop_oneof![0usize..=3, size()])) -> Rope {
        let mut r = Rope::new(batch, seq, heads, head_dim);
        if let Some(rd) = rotary {
            r = r.with_rotary_dim(rd.min(head_dim));
        }
        if interleaved {
            r = r.with_style(RopeStyle::Interleaved);
        }
        r = match angles {
            (Some((theta, l3)), _) => r.with_theta(theta, l3.map(|(factor, low_freq_factor, high_freq_factor, original_max_position)| {
                Llama3Scaling { factor, low_freq_factor, high_freq_factor, original_max_position }
            })),
            (None, max_pos) => r.with_tables(max_pos),
        };
        if let Some(extra) = ld {
            r = r.with_ld(r.width().saturating_add(extra));
        }
        r
    }
}

fn rope_small(r: &Rope) -> bool {
    r.qkv_elems() <= RUN_ELEMS && r.table_elems() <= RUN_ELEMS && r.tokens().saturating_mul(r.width()) <= RUN_WORK
}

fn run_rope<T: Element>(r: &Rope, seed: u64, start: usize, given: &[i32]) {
    let qkv0: Vec<T> = shared::buf(r.qkv_elems(), seed);
    let table = shared::values(r.table_elems(), seed + 1);
    let tables = (r.table_elems() > 0).then(|| RopeTables { cos: &table[..], sin: &table[..] });
    for dir in [RopeDirection::Forward, RopeDirection::Backward] {
        for positions in [Positions::Contiguous { start }, Positions::Given(given)] {
            let mut qkv = qkv0.clone();
            let ok = match positions {
                Positions::Contiguous { start } => r.check_start(start).is_ok(),
                Positions::Given(p) => r.check_positions(p).is_ok(),
            };
            let res = cpu::rope(r, dir, &mut qkv, positions, tables);
            assert_eq!(res.is_ok(), ok, "{}: {res:?}", r.describe());
            assert!(shared::finite(&qkv), "{}", r.describe());
        }
    }
}

prop_compose! {
    fn swiglu()(rows in dim(), f in dim(), interleaved in any::<bool>(),
                lds in prop::option::of((prop_oneof![0usize..=3, size()], prop_oneof![0usize..=3, size()]))) -> SwiGlu {
        let layout = if interleaved { GluLayout::Interleaved } else { GluLayout::Halves };
        let s = SwiGlu::new(rows, f, layout);
        match lds {
            Some((a, b)) => s.with_ld(s.ld_in.saturating_add(a), s.ld_out.saturating_add(b)),
            None => s,
        }
    }
}

fn swiglu_small(s: &SwiGlu) -> bool {
    s.in_elems() <= RUN_ELEMS && s.out_elems() <= RUN_ELEMS && s.rows.saturating_mul(s.f) <= RUN_WORK
}

#[test]
fn problems_run() {
    let n = shared::runnable(rope(), |r| r.validate().is_ok() && rope_small(r));
    assert!(n >= 10, "{n} of 1000 RoPE problems run");
    let n = shared::runnable(swiglu(), |s| s.validate().is_ok() && swiglu_small(s));
    assert!(n >= 10, "{n} of 1000 SwiGLU problems run");
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn rope_problem(r in rope(), dtype in dtype(), seed in any::<u64>(), start in prop_oneof![0usize..4, size()],
                    given in prop::collection::vec(prop_oneof![0i32..8, any::<i32>()], 0..12)) {
        let _ = (r.describe(), r.width(), r.tokens(), r.qkv_elems(), r.table_elems(), r.position_limit(), r.bytes_moved(2));
        let _ = (r.check_start(start), r.check_positions(&given), r.check_call(true), r.check_call(false));
        with_elem!(dtype, T => {
            let mut none: Vec<T> = Vec::new();
            let res = cpu::rope::<T>(&r, RopeDirection::Forward, &mut none, Positions::Contiguous { start: 0 }, None);
            prop_assert!(res.is_err() || r.qkv_elems() == 0);
        });
        if r.validate().is_err() {
            return Ok(());
        }
        prop_assert!(r.bytes_moved(4).is_finite());
        if rope_small(&r) {
            let _ = r.inv_freqs();
            with_elem!(dtype, T => { run_rope::<T>(&r, seed, start, &given) });
        }
    }

    #[test]
    fn swiglu_problem(s in swiglu(), dtype in dtype(), seed in any::<u64>()) {
        let _ = (s.describe(), s.in_elems(), s.out_elems(), s.bytes_moved(2, true));
        with_elem!(dtype, T => {
            let mut none: Vec<T> = Vec::new();
            prop_assert!(cpu::swiglu::<T>(&s, &[], &mut none).is_err() || s.in_elems() == 0 || s.out_elems() == 0);
        });
        if s.validate().is_err() {
            return Ok(());
        }
        if s.rows > 0 && s.f > 0 {
            let (g, u) = s.gate_up_index(s.rows - 1, s.f - 1);
            prop_assert!(g < s.in_elems() && u < s.in_elems());
        }
        if swiglu_small(&s) {
            with_elem!(dtype, T => {
                let gu: Vec<T> = shared::buf(s.in_elems(), seed);
                let mut y: Vec<T> = shared::buf(s.out_elems(), seed + 1);
                cpu::swiglu(&s, &gu, &mut y).unwrap();
                prop_assert!(shared::finite(&y), "{}", s.describe());
                let mut dgu: Vec<T> = shared::buf(s.in_elems(), seed + 2);
                cpu::swiglu_backward(&s, &y, &gu, &mut dgu).unwrap();
                prop_assert!(shared::finite(&dgu), "{}", s.describe());
            });
        }
    }
}
