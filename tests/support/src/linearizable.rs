//! A linearizability checker for histories recorded against real servers: Wing and Gong's
//! search with Lowe's memoisation (a partial linearization is cached as the set of operations
//! it holds and the model's state after them, and never explored twice), as Porcupine does it.
//! Callers split a history by independent object (one journal each) and check each part alone
//! (P-compositionality).
//!
//! An operation with no answer (the server was killed, the connection dropped) is
//! *ambiguous*: it may have taken effect at any point after its call, or never. It has no return
//! event, so the search may place it anywhere after its call or leave it out.
//!
//! Why not stateright's `LinearizabilityTester`: it explores interleavings without memoisation,
//! and a few dozen concurrent calls already take it minutes.

use std::collections::HashSet;
use std::hash::Hash;

/// A sequential specification.
pub trait Model {
    /// The object's state; hashed for the memo.
    type State: Clone + Eq + Hash;
    /// An operation as invoked.
    type Op;
    /// An answer as observed.
    type Ret;

    /// The state before any operation.
    fn init(&self) -> Self::State;

    /// The state after `op` from `state`, when the sequential object answers `ret` there
    /// (`ret` is `None` for an ambiguous call: any answer will do); `None` when it cannot.
    fn step(&self, state: &Self::State, op: &Self::Op, ret: Option<&Self::Ret>) -> Option<Self::State>;
}

/// One call of a history: when it was invoked and answered (any monotonic clock, the same for
/// every call of the history), what it was and what came back (`None`: no answer).
#[derive(Clone, Debug)]
pub struct Call<Op, Ret> {
    /// When the call was sent.
    pub invoked: u64,
    /// When its answer arrived; `None` for an ambiguous call.
    pub answered: Option<(u64, Ret)>,
    /// The operation.
    pub op: Op,
}

/// The checker's verdict.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Some order of the calls, each placed between its invocation and its answer, is one
    /// the model allows; the indexes of that order (ambiguous calls left out are absent).
    Linearizable(Vec<usize>),
    /// No order is; the longest prefix of an order the search found, as call indexes.
    NotLinearizable(Vec<usize>),
}

impl Verdict {
    /// Whether the history is linearizable.
    pub fn is_linearizable(&self) -> bool {
        matches!(self, Verdict::Linearizable(_))
    }
}

/// One event of the time-ordered list the search walks: a call (`Some` matching return
/// index) or a return, linked both ways so that linearized calls can be lifted out and put
/// back in O(1).
struct Node {
    call: usize,
    is_return: bool,
    /// For a call: the node of its return, if it has one.
    ret: Option<usize>,
    prev: usize,
    next: usize,
}

/// Checks `history` against `model`.
pub fn check<M: Model>(model: &M, history: &[Call<M::Op, M::Ret>]) -> Verdict {
    // Events sorted by time; at equal times calls come first (the two calls then overlap, the
    // permissive reading).
    let mut events: Vec<(u64, bool, usize)> = Vec::with_capacity(history.len() * 2);
    for (i, c) in history.iter().enumerate() {
        events.push((c.invoked, false, i));
        if let Some((at, _)) = &c.answered {
            assert!(*at >= c.invoked, "call {i} answered before it was invoked");
            events.push((*at, true, i));
        }
    }
    events.sort_by_key(|&(t, is_return, i)| (t, is_return, i));
    // Node 0 is the head sentinel; event k is node k + 1; the last index is the tail sentinel.
    let n = events.len();
    let tail = n + 1;
    let mut nodes: Vec<Node> = Vec::with_capacity(n + 2);
    nodes.push(Node { call: usize::MAX, is_return: false, ret: None, prev: 0, next: 1 });
    let mut return_node = vec![None; history.len()];
    for (k, &(_, is_return, i)) in events.iter().enumerate() {
        nodes.push(Node { call: i, is_return, ret: None, prev: k, next: k + 2 });
        if is_return {
            return_node[i] = Some(k + 1);
        }
    }
    nodes.push(Node { call: usize::MAX, is_return: false, ret: None, prev: n, next: tail });
    for node in nodes.iter_mut().skip(1).take(n) {
        if !node.is_return {
            node.ret = return_node[node.call];
        }
    }
    let mut returns_left = return_node.iter().filter(|r| r.is_some()).count();

    let mut state = model.init();
    let mut done = Bitset::new(history.len());
    let mut memo: HashSet<(Bitset, M::State)> = HashSet::new();
    // The linearized calls, with the state before each.
    let mut stack: Vec<(usize, M::State)> = Vec::new();
    let mut longest: Vec<usize> = Vec::new();
    let mut at = nodes[0].next;
    while returns_left > 0 {
        if at == tail {
            // Only ambiguous calls are left after a return that could not be reached: cannot
            // happen (a pending return lies before the tail), but backtrack to be safe.
            at = match backtrack(&mut nodes, &mut stack, &mut state, &mut done, &mut returns_left, history) {
                Some(next) => next,
                None => return Verdict::NotLinearizable(longest),
            };
            continue;
        }
        let node = &nodes[at];
        if node.is_return {
            // A call answered here was not linearized before its answer: undo the last choice.
            if stack.len() > longest.len() {
                longest = stack.iter().map(|(node, _)| nodes[*node].call).collect();
            }
            at = match backtrack(&mut nodes, &mut stack, &mut state, &mut done, &mut returns_left, history) {
                Some(next) => next,
                None => return Verdict::NotLinearizable(longest),
            };
            continue;
        }
        let call = node.call;
        let c = &history[call];
        let next = node.next;
        if let Some(after) = model.step(&state, &c.op, c.answered.as_ref().map(|(_, r)| r)) {
            let mut with = done.clone();
            with.set(call);
            if memo.insert((with.clone(), after.clone())) {
                stack.push((at, std::mem::replace(&mut state, after)));
                done = with;
                lift(&mut nodes, at);
                if nodes[at].ret.is_some() {
                    returns_left -= 1;
                }
                at = nodes[0].next;
                continue;
            }
        }
        at = next;
    }
    Verdict::Linearizable(stack.iter().map(|(node, _)| nodes[*node].call).collect())
}

/// Undoes the last linearized call: puts it back in the list and returns the node after it,
/// where the search goes on; `None` when nothing is left to undo.
fn backtrack<S, Op, Ret>(
    nodes: &mut [Node],
    stack: &mut Vec<(usize, S)>,
    state: &mut S,
    done: &mut Bitset,
    returns_left: &mut usize,
    history: &[Call<Op, Ret>],
) -> Option<usize> {
    let (node, before) = stack.pop()?;
    *state = before;
    let call = nodes[node].call;
    done.clear(call);
    unlift(nodes, node);
    if history[call].answered.is_some() {
        *returns_left += 1;
    }
    Some(nodes[node].next)
}

/// Takes a call node and its return node out of the list.
fn lift(nodes: &mut [Node], at: usize) {
    let (prev, next) = (nodes[at].prev, nodes[at].next);
    nodes[prev].next = next;
    nodes[next].prev = prev;
    if let Some(r) = nodes[at].ret {
        let (prev, next) = (nodes[r].prev, nodes[r].next);
        nodes[prev].next = next;
        nodes[next].prev = prev;
    }
}

/// Puts them back (in the reverse order of [`lift`]).
fn unlift(nodes: &mut [Node], at: usize) {
    if let Some(r) = nodes[at].ret {
        let (prev, next) = (nodes[r].prev, nodes[r].next);
        nodes[prev].next = r;
        nodes[next].prev = r;
    }
    let (prev, next) = (nodes[at].prev, nodes[at].next);
    nodes[prev].next = at;
    nodes[next].prev = at;
}

/// The set of linearized calls.
#[derive(Clone, PartialEq, Eq, Hash)]
struct Bitset(Vec<u64>);

impl Bitset {
    fn new(n: usize) -> Bitset {
        Bitset(vec![0; n.div_ceil(64)])
    }

    fn set(&mut self, i: usize) {
        self.0[i / 64] |= 1 << (i % 64);
    }

    fn clear(&mut self, i: usize) {
        self.0[i / 64] &= !(1 << (i % 64));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A register of one integer, starting at 0.
    struct Register;

    #[derive(Debug)]
    enum Op {
        Put(u32),
        Get,
    }

    impl Model for Register {
        type State = u32;
        type Op = Op;
        type Ret = u32;

        fn init(&self) -> u32 {
            0
        }

        fn step(&self, state: &u32, op: &Op, ret: Option<&u32>) -> Option<u32> {
            match op {
                Op::Put(v) => Some(*v),
                Op::Get => (ret.is_none() || ret == Some(state)).then_some(*state),
            }
        }
    }

    fn call(invoked: u64, answered: Option<(u64, u32)>, op: Op) -> Call<Op, u32> {
        Call { invoked, answered, op }
    }

    #[test]
    fn overlapping_calls_may_take_effect_in_either_order() {
        // put(1) overlaps a get that saw 1 and a get that saw 0.
        let h = [call(0, Some((10, 0)), Op::Put(1)), call(1, Some((5, 1)), Op::Get), call(2, Some((3, 0)), Op::Get)];
        assert_eq!(check(&Register, &h), Verdict::Linearizable(vec![2, 0, 1]));
    }

    #[test]
    fn a_read_after_a_completed_write_must_see_it() {
        let h = [call(0, Some((1, 0)), Op::Put(1)), call(2, Some((3, 0)), Op::Get)];
        let v = check(&Register, &h);
        assert!(!v.is_linearizable(), "{v:?}");
        assert_eq!(v, Verdict::NotLinearizable(vec![0]));
    }

    #[test]
    fn an_ambiguous_call_may_take_effect_late_or_never() {
        // put(1) never answered: a get much later may see 1 ...
        let late = [call(0, None, Op::Put(1)), call(100, Some((101, 1)), Op::Get)];
        assert!(check(&Register, &late).is_linearizable());
        // ... or 0, as if it never happened ...
        let never = [call(0, None, Op::Put(1)), call(100, Some((101, 0)), Op::Get)];
        assert_eq!(check(&Register, &never), Verdict::Linearizable(vec![1]));
        // ... but not 1 and then 0.
        let both = [call(0, None, Op::Put(1)), call(100, Some((101, 1)), Op::Get), call(200, Some((201, 0)), Op::Get)];
        assert!(!check(&Register, &both).is_linearizable());
        // Nor can it take effect before it was invoked.
        let early = [call(0, Some((1, 1)), Op::Get), call(5, None, Op::Put(1))];
        assert!(!check(&Register, &early).is_linearizable());
    }

    #[test]
    fn long_histories_of_many_overlapping_calls_finish() {
        // 8 clients, 400 calls each, every call overlapping the others' neighbours: without
        // the memo the search would not end.
        let mut h = Vec::new();
        let mut value = 0;
        for round in 0..400u64 {
            for client in 0..8u64 {
                let t = round * 100 + client;
                if client == 0 {
                    value = round as u32;
                    h.push(call(t, Some((t + 50, 0)), Op::Put(value)));
                } else {
                    h.push(call(t, Some((t + 120, value)), Op::Get));
                }
            }
        }
        assert!(check(&Register, &h).is_linearizable());
    }
}
