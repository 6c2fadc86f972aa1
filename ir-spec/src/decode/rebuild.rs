//! Building the prefill and step programs from the analyzed forward program: every value at its
//! new extents (the batch `B'`; the positions `P` in the prefill, 1 in the step), the keys read
//! from the caches in the step, the caches assigned, the logits of one position returned.

use std::collections::HashMap;

use crate::attr::{Attrs, key};
use crate::decode::analysis::Analysis;
use crate::decode::layout::{Extents, Role, flat_stride};
use crate::decode::{DecodeError, GenerationInfo};
use crate::graph::{Graph, GraphError, Init, NodeId, ValueDef, ValueId};
use crate::op::Op;
use crate::types::{DType, TensorType};

/// Which program to build.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Mode {
    Prefill,
    Step,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Prefill => "prefill",
            Mode::Step => "step",
        }
    }
}

/// How the logits hold the batch and the positions, outside the vocabulary.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum LogitsOrder {
    /// `[B, T, V]` in C order (or `[B·T, V]`).
    BatchFirst,
    /// `[T, B, V]` in C order.
    PositionsFirst,
}

/// How `logits` hold the batch and positions, or why they cannot be read per position.
pub(super) fn logits_order(
    g: &Graph,
    a: &Analysis,
    logits: ValueId,
) -> Result<LogitsOrder, DecodeError> {
    let fail = |problem: &str| DecodeError::LogitsLayout {
        logits: g.name_of(logits).to_string(),
        problem: problem.to_string(),
    };
    let l = a.token_layout(logits);
    let Some(q) = l.get(Role::Query) else {
        return Err(fail("they do not range over the positions"));
    };
    if l.get(Role::Key).is_some() {
        return Err(fail("they range over key positions"));
    }
    let shape = &g.ty(logits).shape;
    let rest = g.ty(logits).numel() / (a.batch * a.context);
    let sq = flat_stride(shape, q);
    // a batch of one is not followed (see `Analysis::run`): it is the outermost factor
    let sb = match l.get(Role::Batch) {
        Some(b) => flat_stride(shape, b),
        None if a.batch == 1 => a.context * rest,
        None => return Err(fail("they do not range over the batch")),
    };
    if sq == rest && sb == a.context * rest {
        Ok(LogitsOrder::BatchFirst)
    } else if sb == rest && sq == a.batch * rest {
        Ok(LogitsOrder::PositionsFirst)
    } else {
        Err(fail(
            "the batch and the positions are not their two outermost factors",
        ))
    }
}

/// Everything both programs are built from.
pub(super) struct Plan<'a> {
    pub forward: &'a Graph,
    pub a: &'a Analysis,
    pub ids: ValueId,
    pub logits: ValueId,
    pub order: LogitsOrder,
    pub info: &'a GenerationInfo,
}

impl Plan<'_> {
    /// The prefill or the step program.
    pub fn build(&self, mode: Mode) -> Result<Graph, DecodeError> {
        let (t, b) = (self.a.context, self.a.batch);
        let (b2, p) = (self.info.batch as usize, self.info.prefill as usize);
        let (queries, keys) = match mode {
            Mode::Prefill => (p, p),
            Mode::Step => (1, t),
        };
        let old = [b, t, t];
        let mut cx = Builder {
            p: self,
            mode,
            ext: Extents {
                old,
                new: [b2, queries, keys],
            },
            cache_ext: Extents {
                old,
                new: [b2, t, t],
            },
            g: Graph::new(format!("{}_{}", self.forward.name, mode.name())),
            map: vec![None; self.forward.values.len()],
            keys: HashMap::new(),
            states: HashMap::new(),
            assigns: Vec::new(),
            position: ValueId(0),
            position_f32: None,
        };
        cx.declare()?;
        for id in self.forward.node_ids() {
            cx.node(id)?;
        }
        cx.finish()
    }
}

struct Builder<'a> {
    p: &'a Plan<'a>,
    mode: Mode,
    /// Forward extents to this program's.
    ext: Extents,
    /// Forward extents to the caches': the positions are the context.
    cache_ext: Extents,
    g: Graph,
    map: Vec<Option<ValueId>>,
    /// Step: values as the keys read them, whole context from the caches.
    keys: HashMap<ValueId, ValueId>,
    /// Cached forward values: their cache state and, once built, the updated cache.
    states: HashMap<ValueId, (ValueId, Option<ValueId>)>,
    assigns: Vec<(ValueId, ValueId)>,
    /// The step's `pos` or the prefill's `last`.
    position: ValueId,
    position_f32: Option<ValueId>,
}

impl Builder<'_> {
    fn fail(&self, value: &str) -> impl Fn(GraphError) -> DecodeError + use<> {
        let (program, value) = (self.mode.name(), value.to_string());
        move |source| DecodeError::Rebuild {
            program,
            value: value.clone(),
            source: Box::new(source),
        }
    }

    fn mapped(&self, v: ValueId) -> ValueId {
        self.map[v.index()].expect("operands precede their users")
    }

    /// A name free in the forward program and in this one.
    fn fresh(&self) -> String {
        (self.g.values.len()..)
            .map(|k| format!("_{k}"))
            .find(|n| self.p.forward.lookup(n).is_none() && self.g.lookup(n).is_none())
            .expect("some name is free")
    }

    /// Adds a helper node with a fresh name.
    fn add(&mut self, op: Op, inputs: &[ValueId], attrs: Attrs) -> Result<ValueId, DecodeError> {
        let name = self.fresh();
        self.named(&name, op, inputs, attrs)
    }

    fn named(
        &mut self,
        name: &str,
        op: Op,
        inputs: &[ValueId],
        attrs: Attrs,
    ) -> Result<ValueId, DecodeError> {
        let names = [name.to_string()];
        let out = self.g.add_node(op, inputs, attrs, Some(&names));
        Ok(out.map_err(self.fail(name))?[0])
    }

    fn shape(&self, v: ValueId) -> Vec<usize> {
        self.g.ty(v).shape.clone()
    }

    /// Params and states (the forward program's, then the caches), then the token ids and the
    /// position input; then what params and states the positions read become.
    fn declare(&mut self) -> Result<(), DecodeError> {
        let f = self.p.forward;
        for v in f.value_ids() {
            let value = f.value(v);
            let (name, ty) = (value.name.clone(), value.ty.clone());
            let new = match &value.def {
                ValueDef::Param(init) => self.g.add_param(name, ty, init.clone()),
                ValueDef::State(init) => self.g.add_state(name, ty, init.clone()),
                _ => continue,
            };
            self.map[v.index()] = Some(new.map_err(self.fail(&value.name))?);
        }
        for (i, &c) in self.p.a.caches.iter().enumerate() {
            let name = &self.p.info.caches[i];
            let shape = self
                .cache_ext
                .resize(&f.ty(c).shape, &self.p.a.layout[c.index()]);
            let ty = TensorType::new(f.ty(c).dtype, shape);
            let state = self.g.add_state(name.clone(), ty, Init::Zeros);
            self.states
                .insert(c, (state.map_err(self.fail(name))?, None));
        }
        let ids_ty = TensorType::i32(vec![
            self.ext.after(Role::Batch),
            self.ext.after(Role::Query),
        ]);
        let ids = self.g.add_input(self.p.info.ids.clone(), ids_ty);
        self.map[self.p.ids.index()] = Some(ids.map_err(self.fail(&self.p.info.ids))?);
        let position = match self.mode {
            Mode::Prefill => &self.p.info.last,
            Mode::Step => &self.p.info.position,
        };
        let input = self
            .g
            .add_input(position.clone(), TensorType::scalar(DType::I32));
        self.position = input.map_err(self.fail(position))?;
        for v in f.value_ids() {
            let l = self.p.a.layout[v.index()];
            if f.value(v).is_persistent() && !l.is_empty() {
                let mut x = self.mapped(v);
                for (role, place) in l.places() {
                    let n = self.ext.after(role);
                    x = match (role, self.mode) {
                        (Role::Query, Mode::Step) => self.gather(x, place.axis)?,
                        _ if n < self.ext.before(role) => {
                            let attrs = Attrs::new()
                                .and(key::AXIS, place.axis)
                                .and(key::START, 0)
                                .and(key::END, n);
                            self.add(Op::Slice, &[x], attrs)?
                        }
                        _ => x,
                    };
                }
                self.map[v.index()] = Some(x);
            }
        }
        Ok(())
    }

    /// `x` at the step's position along `axis` (extent 1 there): `embedding` of its rows.
    fn gather(&mut self, x: ValueId, axis: usize) -> Result<ValueId, DecodeError> {
        let shape = self.shape(x);
        let r = shape.len();
        let perm: Vec<usize> = std::iter::once(axis)
            .chain((0..r).filter(|&d| d != axis))
            .collect();
        let front = if axis == 0 {
            x
        } else {
            self.add(Op::Permute, &[x], Attrs::new().and(key::PERM, perm.clone()))?
        };
        let rest: Vec<usize> = perm[1..].iter().map(|&d| shape[d]).collect();
        let cols: usize = rest.iter().product();
        let table = if r == 2 && axis == 0 {
            front
        } else {
            let attrs = Attrs::new().and(key::SHAPE, vec![shape[axis], cols]);
            self.add(Op::Reshape, &[front], attrs)?
        };
        let row = self.add(Op::Embedding, &[table, self.position], Attrs::new())?;
        let one: Vec<usize> = std::iter::once(1).chain(rest).collect();
        let row = self.add(Op::Reshape, &[row], Attrs::new().and(key::SHAPE, one))?;
        if axis == 0 {
            return Ok(row);
        }
        let mut inverse = vec![0; r];
        for (i, &d) in perm.iter().enumerate() {
            inverse[d] = i;
        }
        self.add(Op::Permute, &[row], Attrs::new().and(key::PERM, inverse))
    }

    /// The position input as f32 (made once).
    fn position_f32(&mut self) -> Result<ValueId, DecodeError> {
        if let Some(v) = self.position_f32 {
            return Ok(v);
        }
        let attrs = Attrs::new().and(key::DTYPE, DType::F32);
        let v = self.add(Op::Cast, &[self.position], attrs)?;
        self.position_f32 = Some(v);
        Ok(v)
    }

    /// One node of the forward program at the new extents.
    fn node(&mut self, id: NodeId) -> Result<(), DecodeError> {
        let (f, a) = (self.p.forward, self.p.a);
        let node = f.node(id);
        let out = node.outputs[0];
        let mut inputs = Vec::with_capacity(node.inputs.len());
        for (i, &u) in node.inputs.iter().enumerate() {
            inputs.push(if a.key_uses.contains_key(&(id, i)) {
                self.key_side(u)?
            } else {
                self.mapped(u)
            });
        }
        let layout = a.layout[out.index()];
        let new_shape = self.ext.resize(&f.ty(out).shape, &layout);
        let mut attrs = node.attrs.clone();
        match node.op {
            Op::Reshape | Op::BroadcastTo | Op::Iota => attrs.put(key::SHAPE, new_shape),
            Op::Slice => {
                let axis = node.attr(key::AXIS);
                if a.layout[node.inputs[0].index()].at(axis).next().is_some() {
                    attrs.put(key::END, self.shape(inputs[0])[axis]);
                }
            }
            _ => {}
        }
        let name = if out == self.p.logits {
            self.fresh()
        } else {
            f.name_of(out).to_string()
        };
        let counts_positions = node.op == Op::Iota
            && self.mode == Mode::Step
            && layout
                .get(Role::Query)
                .is_some_and(|p| p.axis == node.attr(key::AXIS));
        let v = if counts_positions {
            let iota = self.add(node.op, &inputs, attrs)?;
            let pos = self.position_f32()?;
            self.named(&name, Op::Add, &[iota, pos], Attrs::new())?
        } else {
            self.named(&name, node.op, &inputs, attrs)?
        };
        self.map[out.index()] = Some(v);
        if self.states.contains_key(&out) {
            self.update_cache(out, v)?;
        }
        Ok(())
    }

    /// The new value of the cache of forward value `c` (`v` in this program): the step writes
    /// `v` at its position; the prefill writes its positions, zeros after them.
    fn update_cache(&mut self, c: ValueId, v: ValueId) -> Result<(), DecodeError> {
        let (state, _) = self.states[&c];
        let axis = self.p.a.layout[c.index()]
            .get(Role::Query)
            .expect("caches hold positions")
            .axis;
        let t = self.p.a.context;
        let mut tail = self.shape(state);
        let next = match self.mode {
            Mode::Step => {
                let shape: Vec<usize> = std::iter::once(t)
                    .chain(std::iter::repeat_n(1, tail.len() - axis - 1))
                    .collect();
                let attrs = Attrs::new().and(key::SHAPE, shape).and(key::AXIS, 0);
                let iota = self.add(Op::Iota, &[], attrs)?;
                let pos = self.position_f32()?;
                let here = self.add(Op::Eq, &[iota, pos], Attrs::new())?;
                self.add(Op::Where, &[here, v, state], Attrs::new())?
            }
            Mode::Prefill if self.shape(v) == tail => v,
            Mode::Prefill => {
                tail[axis] = t - self.shape(v)[axis];
                let zero = self.add(Op::Constant, &[], Attrs::new().and(key::VALUE, 0.0))?;
                let zeros =
                    self.add(Op::BroadcastTo, &[zero], Attrs::new().and(key::SHAPE, tail))?;
                self.add(Op::Concat, &[v, zeros], Attrs::new().and(key::AXIS, axis))?
            }
        };
        self.states.insert(c, (state, Some(next)));
        self.assigns.push((state, next));
        Ok(())
    }

    /// Operand `u` as the keys read it: in the prefill the value itself (the prompt attends to
    /// itself), in the step the updated cache seen through the views that made `u` from the
    /// cached value.
    fn key_side(&mut self, u: ValueId) -> Result<ValueId, DecodeError> {
        if self.mode == Mode::Prefill {
            return Ok(self.mapped(u));
        }
        if let Some(&v) = self.keys.get(&u) {
            return Ok(v);
        }
        if let Some(&(_, next)) = self.states.get(&u) {
            return Ok(next.expect("a cache is updated where its value is computed"));
        }
        let f = self.p.forward;
        let node = f.node(f.producer(u).expect("keys are views of a cached value"));
        let w = self.key_side(node.inputs[0])?;
        let mut attrs = node.attrs.clone();
        if matches!(node.op, Op::Reshape | Op::BroadcastTo) {
            let shape = self
                .cache_ext
                .resize(&f.ty(u).shape, &self.p.a.layout[u.index()]);
            attrs.put(key::SHAPE, shape);
        }
        let v = self.add(node.op, &[w], attrs)?;
        self.keys.insert(u, v);
        Ok(v)
    }

    /// The logits of one position, `[B', V]`, named as the forward program's; the cache
    /// assigns.
    fn finish(mut self) -> Result<Graph, DecodeError> {
        let info = self.p.info;
        let (b2, v) = (info.batch as usize, info.vocab as usize);
        let l = self.mapped(self.p.logits);
        let reshape = |shape: Vec<usize>| Attrs::new().and(key::SHAPE, shape);
        let out = match self.mode {
            Mode::Step => self.named(&info.logits, Op::Reshape, &[l], reshape(vec![b2, v]))?,
            Mode::Prefill => {
                let p = info.prefill as usize;
                let table = match self.p.order {
                    LogitsOrder::BatchFirst if b2 > 1 => {
                        let x = self.add(Op::Reshape, &[l], reshape(vec![b2, p, v]))?;
                        let perm = Attrs::new().and(key::PERM, vec![1, 0, 2]);
                        let x = self.add(Op::Permute, &[x], perm)?;
                        self.add(Op::Reshape, &[x], reshape(vec![p, b2 * v]))?
                    }
                    LogitsOrder::BatchFirst | LogitsOrder::PositionsFirst => {
                        self.add(Op::Reshape, &[l], reshape(vec![p, b2 * v]))?
                    }
                };
                let row = self.add(Op::Embedding, &[table, self.position], Attrs::new())?;
                self.named(&info.logits, Op::Reshape, &[row], reshape(vec![b2, v]))?
            }
        };
        self.g.add_output(out);
        for (state, next) in std::mem::take(&mut self.assigns) {
            let name = self.g.name_of(state).to_string();
            self.g.add_assign(state, next).map_err(self.fail(&name))?;
        }
        Ok(self.g)
    }
}
