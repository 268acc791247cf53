//! The public items every regrouped normalization object ([`LayerNorm`](crate::norm::LayerNorm),
//! [`GroupNorm`](crate::norm::GroupNorm)) shares, declared once: its accessors and its three
//! `Cudnn` launches, each a thin wrapper over the [`Regrouped`](super::Regrouped) engine in its
//! `core` field.

/// The accessors of a regrouped normalization object `$ty<T>` (fields `core: Regrouped<T>` and
/// `layout: Layout`): `layout`, `dims`, `len`, `is_empty`, `epsilon`, `method` (documented with
/// the default method `NormMethod::$default`), `with_method` (which then calls the type's own
/// `method_chosen`) and `backward_workspace_size` (each documented by the attributes given).
macro_rules! regrouped_accessors {
    (
        $ty:ident, $default:literal;
        $(#[$with:meta])*
        fn with_method;
        $(#[$ws:meta])*
        fn backward_workspace_size;
    ) => {
        impl<T: $crate::norm::NormType> $ty<T> {
            /// The layout of `x`, `y`, `dy` and `dx`.
            pub fn layout(&self) -> &$crate::tensor::Layout {
                &self.layout
            }
            /// The tensor dimensions.
            pub fn dims(&self) -> &[i64] {
                self.layout.dims()
            }
            /// Elements of `x`, `y`, `dy`, `dx`.
            pub fn len(&self) -> usize {
                self.core.len()
            }
            /// Whether the tensor is empty (never: every dimension is at least 1).
            pub fn is_empty(&self) -> bool {
                false
            }
            /// The epsilon.
            pub fn epsilon(&self) -> f64 {
                self.core.epsilon
            }
            #[doc = concat!("The formulation used (by default [`NormMethod::", $default, "`]).")]
            pub fn method(&self) -> $crate::norm::NormMethod {
                self.core.method
            }
            $(#[$with])*
            /// Every method gives the same result up to rounding; they differ in speed.
            /// Rebuilds the descriptors (host only); saved values of the old object do not fit
            /// the new one.
            pub fn with_method(
                self,
                method: $crate::norm::NormMethod,
            ) -> $crate::error::Result<Self> {
                Ok(Self {
                    core: self.core.with_method(method)?,
                    ..self
                }
                .method_chosen())
            }
            $(#[$ws])*
            #[doc(alias = "cudnnGetReductionWorkspaceSize")]
            pub fn backward_workspace_size(
                &self,
                cudnn: &$crate::handle::Cudnn,
            ) -> $crate::error::Result<usize> {
                self.core.backward_workspace_size(cudnn)
            }
        }
    };
}

/// The three `Cudnn` launches of a regrouped normalization object `$ty<T>`, taken as `$obj`:
/// the forward saving nothing, the training forward returning
/// [`NormSaved`](crate::norm::NormSaved), and the backward (`dx`, `dγ`, `dβ`), each documented
/// by the attributes given and delegating to the object's `core`.
macro_rules! regrouped_launches {
    (
        $ty:ident, $obj:ident;
        $(#[$fwd:meta])*
        fn $forward:ident;
        $(#[$train:meta])*
        fn $training:ident;
        $(#[$bwd:meta])*
        fn $backward:ident;
    ) => {
        impl $crate::handle::Cudnn {
            $(#[$fwd])*
            pub fn $forward<T: $crate::norm::NormType>(
                &self,
                $obj: &$ty<T>,
                x: &impl $crate::buffer::DeviceBuffer<T>,
                gamma: &impl $crate::buffer::DeviceBuffer<T>,
                beta: &impl $crate::buffer::DeviceBuffer<T>,
                y: &mut impl $crate::buffer::DeviceBufferMut<T>,
            ) -> $crate::error::Result<()> {
                $obj.core.forward(self, x, gamma, beta, y)
            }

            $(#[$train])*
            pub fn $training<'x, T: $crate::norm::NormType>(
                &self,
                $obj: &$ty<T>,
                x: &'x impl $crate::buffer::DeviceBuffer<T>,
                gamma: &impl $crate::buffer::DeviceBuffer<T>,
                beta: &impl $crate::buffer::DeviceBuffer<T>,
                y: &mut impl $crate::buffer::DeviceBufferMut<T>,
            ) -> $crate::error::Result<$crate::norm::NormSaved<'x, T>> {
                $obj.core.forward_training(self, x, gamma, beta, y)
            }

            $(#[$bwd])*
            #[allow(clippy::too_many_arguments)] // the layer's inputs and outputs
            pub fn $backward<T: $crate::norm::NormType>(
                &self,
                $obj: &$ty<T>,
                saved: &$crate::norm::NormSaved<'_, T>,
                x: &impl $crate::buffer::DeviceBuffer<T>,
                dy: &impl $crate::buffer::DeviceBuffer<T>,
                gamma: &impl $crate::buffer::DeviceBuffer<T>,
                dx: &mut impl $crate::buffer::DeviceBufferMut<T>,
                dgamma: &mut impl $crate::buffer::DeviceBufferMut<T>,
                dbeta: &mut impl $crate::buffer::DeviceBufferMut<T>,
                workspace: &mut $crate::workspace::Workspace,
            ) -> $crate::error::Result<()> {
                $obj.core
                    .backward(self, saved, x, dy, gamma, dx, dgamma, dbeta, workspace)
            }
        }
    };
}

pub(in crate::norm) use {regrouped_accessors, regrouped_launches};
