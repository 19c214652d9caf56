//! The A/B switch on a CUDA GPU (ignored elsewhere): off, every call is burn's own op (counted
//! as fallen back) and equals burn's result exactly; on again, gemmbridge serves. The switch and
//! the counts are process-wide, so the test runs alone ([`crate::exclusive`]).

use burn::tensor::{Distribution, Tensor};
use burn_cubecl::CubeBackend;
use cubecl::cuda::CudaRuntime;
use gemmbridge_burn::{counts, matmul, set_enabled};

type Plain = CubeBackend<CudaRuntime, f32, i32, u8>;

#[test]
#[ignore = "needs a CUDA GPU"]
fn switch_off_is_burns_own_matmul_and_on_is_gemmbridge() {
    let _alone = crate::exclusive();
    let dev = Default::default();
    let a = Tensor::<Plain, 2>::random([64, 48], Distribution::Normal(0.0, 1.0), &dev);
    let b = Tensor::<Plain, 2>::random([48, 40], Distribution::Normal(0.0, 1.0), &dev);
    let burn = a.clone().matmul(b.clone()).into_data().to_vec::<f32>().unwrap();

    set_enabled(false);
    let (served, fell_back) = counts();
    let off = matmul(a.clone(), b.clone()).into_data().to_vec::<f32>().unwrap();
    assert_eq!(counts(), (served, fell_back + 1), "off: the call is counted as burn's");
    assert_eq!(off, burn, "off: burn's own matmul, bit for bit");

    set_enabled(true);
    let on = matmul(a, b).into_data().to_vec::<f32>().unwrap();
    assert_eq!(counts(), (served + 1, fell_back + 1), "on: gemmbridge serves");
    assert!(on.iter().all(|v| v.is_finite()));
}
