//! Process-wide settings, and the cuDNN handle and autotuner of each thread and device.
use std::any::Any;
use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::Mutex;

use candle_core::cuda::DeviceId;
use candle_core::CudaDevice;
use cudnn_safe::graph::PlanCache;
use cudnn_safe::tune::{Autotuner, Policy, SearchEffort};
use cudnn_safe::{Cudnn, Workspace};

use crate::error::wrap;

/// How the operations choose their algorithms ([`set_options`]).
///
/// ```
/// use cudnn_safe_candle::{set_options, Options};
/// use cudnn_safe_candle::cudnn_safe::tune::SearchEffort;
/// set_options(Options::default().with_effort(SearchEffort::Thorough).with_allow_tf32(true));
/// assert!(cudnn_safe_candle::options().allow_tf32);
/// # set_options(Options::default());
/// ```
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Options {
    /// The convolution autotuner's policy (default [`Policy::Benchmark`]: candidates timed at
    /// the first call of each problem, as PyTorch's `cudnn.benchmark = True`;
    /// [`Policy::Deterministic`] for reproducible results).
    pub policy: Policy,
    /// How much that first call searches (default [`SearchEffort::Quick`]: a few candidates,
    /// first results in about PyTorch's time; [`SearchEffort::Thorough`] searches more).
    pub effort: SearchEffort,
    /// Whether f32 convolutions may run on TF32 tensor cores (default `false`: strict f32, as
    /// candle's own f32 kernels; PyTorch's `allow_tf32`).
    pub allow_tf32: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            policy: Policy::Benchmark,
            effort: SearchEffort::Quick,
            allow_tf32: false,
        }
    }
}

impl Options {
    /// With `policy`.
    #[must_use]
    pub fn with_policy(mut self, policy: Policy) -> Self {
        self.policy = policy;
        self
    }
    /// With `effort`.
    #[must_use]
    pub fn with_effort(mut self, effort: SearchEffort) -> Self {
        self.effort = effort;
        self
    }
    /// With `allow_tf32`.
    #[must_use]
    pub fn with_allow_tf32(mut self, allow: bool) -> Self {
        self.allow_tf32 = allow;
        self
    }
}

static OPTIONS: Mutex<Option<Options>> = Mutex::new(None);

/// Sets the options every later call uses, on every thread. A thread whose tuner was made under
/// another policy or effort starts a new one at its next call (its decisions so far are dropped;
/// those in a cache file stay there).
pub fn set_options(options: Options) {
    let mut o = OPTIONS.lock().unwrap_or_else(|p| p.into_inner());
    *o = Some(options);
}

/// The options in force ([`Options::default`] until [`set_options`]).
pub fn options() -> Options {
    let o = OPTIONS.lock().unwrap_or_else(|p| p.into_inner());
    o.clone().unwrap_or_default()
}

/// One thread's cuDNN handle on a device's stream, and its tuner.
struct State {
    cudnn: Cudnn,
    tuner: Autotuner,
    /// The policy and effort the tuner was made with.
    made: (Policy, SearchEffort),
    /// What the graph operations (attention, normalization) keep between calls.
    held: Held,
}

/// What the graph operations keep on a thread's handle: a workspace, and their built graphs and
/// plans by problem (each operation's own type under its own key).
pub(crate) struct Held {
    pub(crate) ws: Workspace,
    /// The plans the fused convolutions chose (timed at their first call).
    pub(crate) plans: PlanCache,
    pub(crate) objects: Objects,
}

/// Objects of any type by key.
#[derive(Default)]
pub(crate) struct Objects(HashMap<String, Box<dyn Any>>);

impl Objects {
    /// Whether an object is kept under `key`.
    pub(crate) fn contains(&self, key: &str) -> bool {
        self.0.contains_key(key)
    }

    /// Keeps `object` under `key` (replacing any).
    pub(crate) fn insert<O: Any>(&mut self, key: String, object: O) {
        self.0.insert(key, Box::new(object));
    }

    /// The object under `key`, made by `make` at the first call (an error is returned and
    /// nothing kept).
    pub(crate) fn get_or_make<O: Any>(
        &mut self,
        key: String,
        make: impl FnOnce() -> cudnn_safe::Result<O>,
    ) -> cudnn_safe::Result<&mut O> {
        use std::collections::hash_map::Entry;
        let slot = match self.0.entry(key) {
            Entry::Occupied(e) => e.into_mut(),
            Entry::Vacant(v) => v.insert(Box::new(make()?)),
        };
        slot.downcast_mut::<O>()
            .ok_or_else(|| cudnn_safe::Error::InvalidArgument {
                what: "cudnn-safe-candle held object",
                expected: "an object of the type its key names".into(),
                got: "another type".into(),
            })
    }
}

thread_local! {
    // One handle per thread and candle device: `Cudnn` is `Send`, not `Sync`.
    static STATES: RefCell<HashMap<DeviceId, State>> = RefCell::new(HashMap::new());
}

fn tuner(o: &Options) -> Autotuner {
    Autotuner::new(o.policy).with_effort(o.effort)
}

/// Runs `f` on this thread's state for `dev` (made at the first call, the tuner renewed when the
/// options' policy or effort changed).
fn with<R>(
    dev: &CudaDevice,
    f: impl FnOnce(&mut State, &Options) -> cudnn_safe::Result<R>,
) -> candle_core::Result<R> {
    let o = options();
    STATES.with(|states| {
        let mut states = states.borrow_mut();
        let state = match states.entry(dev.id()) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(v) => v.insert(State {
                cudnn: Cudnn::new(dev.cuda_stream()).map_err(wrap)?,
                tuner: tuner(&o),
                made: (o.policy, o.effort),
                held: Held {
                    ws: Workspace::new(dev.cuda_stream()),
                    plans: PlanCache::new(),
                    objects: Objects::default(),
                },
            }),
        };
        if state.made != (o.policy, o.effort) {
            state.tuner = tuner(&o);
            state.made = (o.policy, o.effort);
        }
        f(state, &o).map_err(wrap)
    })
}

/// Runs `f` with this thread's handle (on `dev`'s stream) and tuner for `dev`.
pub(crate) fn with_state<R>(
    dev: &CudaDevice,
    f: impl FnOnce(&Cudnn, &mut Autotuner, &Options) -> cudnn_safe::Result<R>,
) -> candle_core::Result<R> {
    with(dev, |s, o| f(&s.cudnn, &mut s.tuner, o))
}

/// Runs `f` with this thread's handle for `dev` and what the graph operations keep on it.
pub(crate) fn with_held<R>(
    dev: &CudaDevice,
    f: impl FnOnce(&Cudnn, &mut Held) -> cudnn_safe::Result<R>,
) -> candle_core::Result<R> {
    with(dev, |s, _| f(&s.cudnn, &mut s.held))
}
