//! The settings' defaults, builders and checks (no device needed).

use super::*;
use crate::cuda::dnn::{ConvApi, ConvSearch};
use crate::cuda::route::{Backend, Padding};
use crate::error::Error;
use crate::grouped::streams::MAX_STREAMS;

#[test]
fn defaults_are_the_engines_former_defaults() {
    let o = GpuOptions::default();
    assert_eq!(o.backend, Backend::Auto);
    assert_eq!(o.workspace_bytes, None);
    assert_eq!(o.padding, Padding::default());
    assert!(o.padding.enabled);
    assert_eq!(o.graph_replay, GraphReplay::default());
    assert!(o.graph_replay.enabled);
    assert_eq!(o.sm_count_target, None);
    assert!(!o.check_raw_addresses);
    assert_eq!(o.conv_search, ConvSearch::Heuristic);
    assert_eq!(o.conv_api, ConvApi::Graph);
    assert!(o.conv_fusion);
    assert_eq!(o.conv_workspace_limit, 1 << 30);
    assert!(!o.attention_search);
    assert_eq!(o.grouped_backend, None);
    assert_eq!(o.grouped_streams, 4);
    assert_eq!(o.plan_cache_capacity, 4096);
    assert!(o.norm_fusion);
}

#[test]
fn builders_set_one_field_each() {
    let o = GpuOptions::default().backend(Backend::Blas).grouped_streams(8).sm_count_target(Some(3));
    assert_eq!((o.backend, o.grouped_streams, o.sm_count_target), (Backend::Blas, 8, Some(3)));
    assert_eq!(
        GpuOptions { backend: Backend::Auto, grouped_streams: 4, sm_count_target: None, ..o },
        GpuOptions::default()
    );
}

#[test]
fn validation_names_the_value_out_of_range() {
    let sm = |n| GpuOptions::default().sm_count_target(Some(n)).validate_for(132);
    for bad in [0, 133] {
        match sm(bad) {
            Err(Error::OutOfRange { what: "SM count target", value, .. }) => assert_eq!(value, u64::from(bad)),
            r => panic!("SM count target {bad}: {r:?}"),
        }
    }
    assert!(sm(1).is_ok() && sm(132).is_ok());
    for bad in [0, MAX_STREAMS + 1] {
        match GpuOptions::default().grouped_streams(bad).validate_for(132) {
            Err(Error::OutOfRange { what: "grouped GEMM streams", value, .. }) => assert_eq!(value, bad as u64),
            r => panic!("{bad} streams: {r:?}"),
        }
    }
    assert!(GpuOptions::default().grouped_streams(MAX_STREAMS).validate_for(132).is_ok());
    assert!(GpuOptions::default().validate_for(1).is_ok());
}

/// Options out of range whose rule needs no device, the setting's name and the value.
fn bad_without_a_device() -> Vec<(GpuOptions, &'static str, u64)> {
    let max = GpuOptions::MAX_WORKSPACE_BYTES;
    let max_plans = GpuOptions::MAX_PLAN_CACHE_CAPACITY;
    vec![
        (GpuOptions::default().sm_count_target(Some(0)), "SM count target", 0),
        (GpuOptions::default().grouped_streams(0), "grouped GEMM streams", 0),
        (GpuOptions::default().grouped_streams(MAX_STREAMS + 1), "grouped GEMM streams", MAX_STREAMS as u64 + 1),
        (GpuOptions::default().workspace_bytes(Some(max + 1)), "workspace bytes", max as u64 + 1),
        (GpuOptions::default().workspace_bytes(Some(usize::MAX)), "workspace bytes", usize::MAX as u64),
        (GpuOptions::default().plan_cache_capacity(0), "plan cache capacity", 0),
        (GpuOptions::default().plan_cache_capacity(max_plans + 1), "plan cache capacity", max_plans as u64 + 1),
    ]
}

#[test]
fn the_device_free_rules_are_checked_without_a_device() {
    for (options, name, v) in bad_without_a_device() {
        match options.validate() {
            Err(Error::OutOfRange { what, value, .. }) => assert_eq!((what, value), (name, v)),
            r => panic!("{name} {v}: {r:?}"),
        }
    }
    // the SM count's upper bound needs the device; any workspace the arithmetic holds passes
    let fine = GpuOptions::default().sm_count_target(Some(u32::MAX)).grouped_streams(MAX_STREAMS);
    assert!(fine.workspace_bytes(Some(GpuOptions::MAX_WORKSPACE_BYTES)).validate().is_ok());
    assert!(GpuOptions::default().workspace_bytes(Some(0)).validate().is_ok());
    for plans in [1, GpuOptions::MAX_PLAN_CACHE_CAPACITY] {
        assert!(GpuOptions::default().plan_cache_capacity(plans).validate().is_ok());
    }
    assert!(GpuOptions::default().validate().is_ok());
}

/// The constructors check the options before they look for the driver or a device, so the
/// bad value is named on a machine without a GPU too (there a valid value gets
/// `LibraryNotFound` or `NoDevice`).
#[test]
fn constructors_name_a_bad_option_before_looking_for_a_device() {
    for (options, name, v) in bad_without_a_device() {
        match Gpu::with_options(0, options) {
            Err(Error::OutOfRange { what, value, .. }) => assert_eq!((what, value), (name, v)),
            r => panic!("{name} {v}: {:?}", r.map(|g| g.options())),
        }
    }
}
