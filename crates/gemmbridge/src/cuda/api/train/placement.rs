//! Which of a GPU layer's activation steps run in cuBLASLt epilogues and which in gemmbridge's
//! kernels ([`crate::train`] says why each activation is placed where it is).

use crate::epilogue::Epilogue;
use crate::precision::Precision;
use crate::problem::AUX_LD_MULTIPLE;
use crate::train::{Activation, GeluBiasGrad, GeluPlacement, LinearSpec, Placement};

/// What decides the placements of one [`super::Mlp`]: its precision, whether its GEMMs run in
/// FP8, and the caller's [`GeluPlacement`].
#[derive(Clone, Copy, Debug)]
pub(super) struct Placements {
    pub precision: Precision,
    pub fp8: bool,
    pub gelu: GeluPlacement,
}

impl Placements {
    /// Whether cuBLASLt's GELU epilogues may apply the tanh GELU: not in strict f32, where
    /// they are less accurate than f32 arithmetic (measured on the H200 with cuBLASLt 13.1: an
    /// MLP block's output 11× PyTorch's error against float64, its gradients 11–21×; tf32, f16
    /// and bf16 at or below PyTorch's), and not in FP8 layers, whose GEMMs have no such epilogue.
    fn gelu_epilogues(&self) -> bool {
        self.precision != Precision::F32 && !self.fp8
    }

    /// Whether the layer's activation runs as a kernel after its (high-precision) forward GEMM,
    /// the GEMM writing the pre-activation: GELU-erf always, GELU-tanh where the epilogue is not
    /// used.
    pub fn act_kernel(&self, l: &LinearSpec) -> bool {
        match l.activation {
            Activation::GeluErf => true,
            Activation::GeluTanh => !self.gelu_epilogues() || self.gelu.forward == Placement::Kernel,
            Activation::None | Activation::Relu => false,
        }
    }

    /// The pre-activation's row stride: cuBLASLt's rule for an epilogue's aux
    /// ([`AUX_LD_MULTIPLE`]), or the GEMM's own contiguous C when a kernel applies the
    /// activation (always in FP8 layers).
    pub fn pre_ld(&self, l: &LinearSpec) -> usize {
        if self.fp8 || self.act_kernel(l) {
            l.out_features
        } else {
            l.out_features.next_multiple_of(AUX_LD_MULTIPLE)
        }
    }

    /// The epilogue that applies `l`'s activation backward in the next layer's data-gradient
    /// GEMM, if one does: the GELU-tanh backward (`DGelu`) where the epilogues apply, the caller
    /// placed it there and the saved pre-activation's stride meets the aux rule.
    /// With a bias and [`GeluBiasGrad::DataGrad`], the epilogue writes `l`'s bias gradient too
    /// (`DGeluBiasGrad`).
    pub fn fused_backward(&self, l: &LinearSpec) -> Option<Epilogue> {
        let fused = l.activation.fused_backward().filter(|_| {
            self.gelu_epilogues()
                && self.gelu.backward == Placement::Epilogue
                && self.pre_ld(l).is_multiple_of(AUX_LD_MULTIPLE)
        });
        match fused {
            Some(Epilogue::DGelu) if l.bias && self.gelu.bias_grad == GeluBiasGrad::DataGrad => {
                Some(Epilogue::DGeluBiasGrad)
            }
            other => other,
        }
    }

    /// Whether the next layer's data-gradient GEMM writes `l`'s bias gradient (`l` is not the
    /// last layer).
    pub fn bias_grad_by_next(&self, l: &LinearSpec) -> bool {
        self.fused_backward(l) == Some(Epilogue::DGeluBiasGrad)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(precision: Precision, fp8: bool, forward: Placement, backward: Placement) -> Placements {
        Placements { precision, fp8, gelu: GeluPlacement { forward, backward, bias_grad: GeluBiasGrad::WeightGrad } }
    }

    #[test]
    fn gelu_tanh_goes_where_asked_in_16_bit_and_tf32() {
        use Placement::{Epilogue as E, Kernel as K};
        let l = LinearSpec::new(64, 256).with_activation(Activation::GeluTanh);
        for p in [Precision::TF32, Precision::F16, Precision::BF16] {
            assert!(!at(p, false, E, E).act_kernel(&l));
            assert_eq!(at(p, false, E, E).fused_backward(&l), Some(Epilogue::DGelu));
            assert!(at(p, false, K, E).act_kernel(&l));
            assert_eq!(at(p, false, K, E).fused_backward(&l), Some(Epilogue::DGelu));
            assert_eq!(at(p, false, E, K).fused_backward(&l), None);
            assert!(!at(p, false, E, K).act_kernel(&l));
            assert_eq!(at(p, false, K, K).fused_backward(&l), None);
        }
    }

    #[test]
    fn the_bias_gradient_moves_into_dgelu_only_where_asked_and_possible() {
        use Placement::{Epilogue as E, Kernel as K};
        let l = LinearSpec::new(64, 256).with_activation(Activation::GeluTanh);
        let mut p = at(Precision::BF16, false, E, E);
        assert!(!p.bias_grad_by_next(&l));
        p.gelu.bias_grad = GeluBiasGrad::DataGrad;
        assert_eq!(p.fused_backward(&l), Some(Epilogue::DGeluBiasGrad));
        assert!(p.bias_grad_by_next(&l));
        // no bias: nothing to write; a kernel backward or f32: no epilogue to write it
        assert_eq!(p.fused_backward(&l.without_bias()), Some(Epilogue::DGelu));
        assert!(!p.bias_grad_by_next(&l.without_bias()));
        p.gelu.backward = K;
        assert!(!p.bias_grad_by_next(&l));
        let mut f = at(Precision::F32, false, E, E);
        f.gelu.bias_grad = GeluBiasGrad::DataGrad;
        assert!(!f.bias_grad_by_next(&l));
    }

    #[test]
    fn f32_fp8_and_unaligned_widths_keep_their_kernels() {
        use Placement::{Epilogue as E, Kernel as K};
        let l = LinearSpec::new(64, 256).with_activation(Activation::GeluTanh);
        // f32 and FP8: kernels whatever is asked
        assert!(at(Precision::F32, false, E, E).act_kernel(&l));
        assert_eq!(at(Precision::F32, false, E, E).fused_backward(&l), None);
        assert_eq!(at(Precision::BF16, true, E, E).fused_backward(&l), None);
        assert_eq!(at(Precision::BF16, true, E, E).pre_ld(&l), 256);
        // 65 wide: the epilogue's aux pads to 72; a kernel forward leaves 65, so the backward
        // cannot be an epilogue
        let odd = LinearSpec::new(64, 65).with_activation(Activation::GeluTanh);
        assert_eq!(at(Precision::BF16, false, E, E).pre_ld(&odd), 72);
        assert_eq!(at(Precision::BF16, false, E, E).fused_backward(&odd), Some(Epilogue::DGelu));
        assert_eq!(at(Precision::BF16, false, K, E).pre_ld(&odd), 65);
        assert_eq!(at(Precision::BF16, false, K, E).fused_backward(&odd), None);
        // GELU-erf is a kernel both ways, ReLU's forward an epilogue
        let erf = LinearSpec::new(64, 256).with_activation(Activation::GeluErf);
        assert!(at(Precision::BF16, false, E, E).act_kernel(&erf));
        assert_eq!(at(Precision::BF16, false, E, E).fused_backward(&erf), None);
        let relu = LinearSpec::new(64, 256).with_activation(Activation::Relu);
        assert!(!at(Precision::BF16, false, K, K).act_kernel(&relu));
    }
}
