//! Routing append results back to the connections that asked: the writer answers each shard
//! once per commit, and the shard's dispatcher runs each request's completion.

use crate::writer::AppendResult;
use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

/// What a shard does with an append's result when it arrives: answer the client (runs on
/// the dispatcher, so it must not block).
pub(crate) type Completion = Box<dyn FnOnce(AppendResult)>;

/// Per-shard routing of append results: the writer sends one message per commit to this
/// shard's sink; the dispatcher runs each waiting request's completion by token, in the
/// order the writer answered them.
pub(crate) struct ReplyRouter {
    sink: flume::Sender<Vec<(u64, AppendResult)>>,
    waiting: RefCell<HashMap<u64, Completion>>,
    next_token: std::cell::Cell<u64>,
}

impl ReplyRouter {
    /// A router and the receiving end of its sink (for [`ReplyRouter::dispatch`]).
    pub(super) fn new() -> (Rc<ReplyRouter>, flume::Receiver<Vec<(u64, AppendResult)>>) {
        let (tx, rx) = flume::unbounded();
        (Rc::new(ReplyRouter { sink: tx, waiting: RefCell::new(HashMap::new()), next_token: std::cell::Cell::new(1) }), rx)
    }

    /// Registers `done` to run with the result; returns the reply target and its token.
    pub(crate) fn register(&self, done: Completion) -> (crate::writer::ReplyTo, u64) {
        let token = self.next_token.get();
        self.next_token.set(token + 1);
        self.waiting.borrow_mut().insert(token, done);
        (crate::writer::ReplyTo::Batched { sink: self.sink.clone(), token }, token)
    }

    /// Takes back the completion of a request that never reached the writer.
    pub(crate) fn forget(&self, token: u64) -> Option<Completion> {
        self.waiting.borrow_mut().remove(&token)
    }

    /// Runs each result's completion as the writer's messages arrive, until the sink closes.
    pub(super) async fn dispatch(self: Rc<Self>, rx: flume::Receiver<Vec<(u64, AppendResult)>>) {
        while let Ok(batch) = rx.recv_async().await {
            for (token, res) in batch {
                // Not borrowed while a completion runs.
                let done = self.waiting.borrow_mut().remove(&token);
                if let Some(done) = done {
                    done(res);
                }
            }
        }
    }
}
