//! Subtasks: the loops that move batches and barriers, align barriers on several inputs,
//! snapshot state, and report to the checkpoint coordinator.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use arrow::record_batch::RecordBatch;
use shareflow_checkpoint::CheckpointId;
use tokio::sync::mpsc;

use crate::channel::{Barrier, Collector, Message, Tagged, HOLD_WATERMARK};
use crate::error::{Result, RuntimeError};
use crate::metrics::OperatorMetrics;
use crate::operator::{Operator, Source, SourceEvent, StateItems, SubtaskContext};

/// Coordinator -> task.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Control {
    Complete(CheckpointId),
    Aborted(CheckpointId),
}

/// Task -> coordinator.
#[derive(Debug)]
pub(crate) enum Report {
    Ack { checkpoint_id: CheckpointId, node: usize, subtask: u32, state: StateItems },
    SourceFinished,
    Finished,
    Failed(RuntimeError),
}

/// The inputs of a subtask, merged, with barrier alignment: once barrier n arrived on
/// an input, that input's later messages wait until n arrived on every input.
pub(crate) struct Inputs {
    rx: mpsc::Receiver<Tagged>,
    /// Raw input index -> the operator's logical input (edge) number.
    edge_of: Vec<usize>,
    queued: Vec<VecDeque<Message>>,
    blocked: Vec<bool>,
    ended: Vec<bool>,
    aligning: Option<Barrier>,
    /// Per raw input, the watermark it sent in the current checkpoint's period, if any.
    watermarks: Vec<Option<i64>>,
    /// Per raw input, the last watermark it ever sent.
    last_watermarks: Vec<Option<i64>>,
}

/// What the inputs produce for the operator.
pub(crate) enum InputEvent {
    Batch(usize, RecordBatch),
    /// Barrier n arrived on every live input.
    Aligned(Barrier),
    /// Every input ended.
    AllEnded,
}

impl Inputs {
    pub(crate) fn new(rx: mpsc::Receiver<Tagged>, inputs: usize, edge_of: Vec<usize>) -> Self {
        Self {
            rx,
            edge_of,
            queued: vec![VecDeque::new(); inputs],
            blocked: vec![false; inputs],
            ended: vec![false; inputs],
            aligning: None,
            watermarks: vec![None; inputs],
            last_watermarks: vec![None; inputs],
        }
    }

    /// The minimum of the watermarks the inputs sent since the last alignment, over the
    /// inputs that were not idle. If every input was idle, none holds the watermark
    /// back: the newest of the last watermarks they sent (`None` if none ever sent
    /// one). `None` too while an input holds it ([`HOLD_WATERMARK`]). Resets the
    /// period's.
    pub(crate) fn take_watermark(&mut self) -> Option<i64> {
        let min = self.watermarks.iter().flatten().min().copied();
        self.watermarks.iter_mut().for_each(|w| *w = None);
        min.or_else(|| self.last_watermarks.iter().flatten().max().copied()).filter(|w| *w != HOLD_WATERMARK)
    }

    fn raw_next(&mut self) -> Option<(usize, Message)> {
        (0..self.queued.len())
            .find(|&i| !self.blocked[i] && !self.queued[i].is_empty())
            .and_then(|i| Some((i, self.queued[i].pop_front()?)))
    }

    fn aligned(&self) -> bool {
        (0..self.blocked.len()).all(|i| self.blocked[i] || self.ended[i])
    }

    /// The next event. Cancel-safe: nothing is lost if the future is dropped.
    pub(crate) async fn next(&mut self, task: &str) -> Result<InputEvent> {
        loop {
            let (input, message) = match self.raw_next() {
                Some(m) => m,
                None => {
                    let tagged = self
                        .rx
                        .recv()
                        .await
                        .ok_or_else(|| RuntimeError::Cancelled(format!("{task}: inputs closed")))?;
                    if self.blocked[tagged.input] || !self.queued[tagged.input].is_empty() {
                        self.queued[tagged.input].push_back(tagged.message);
                        continue;
                    }
                    (tagged.input, tagged.message)
                }
            };
            match message {
                Message::Batch(b) => return Ok(InputEvent::Batch(self.edge_of.get(input).copied().unwrap_or(0), b)),
                Message::Watermark(w) => {
                    if let Some(w) = w {
                        let slot = &mut self.watermarks[input];
                        *slot = Some(slot.map_or(w, |old: i64| old.max(w)));
                        self.last_watermarks[input] = *slot;
                    }
                }
                Message::Barrier(b) => {
                    match self.aligning {
                        None => self.aligning = Some(b),
                        Some(current) if current.checkpoint_id == b.checkpoint_id => {}
                        Some(current) => {
                            return Err(RuntimeError::Internal(format!(
                                "{task}: barrier {} arrived while aligning barrier {}",
                                b.checkpoint_id, current.checkpoint_id
                            )))
                        }
                    }
                    self.blocked[input] = true;
                    if self.aligned() {
                        self.blocked.iter_mut().for_each(|b| *b = false);
                        self.aligning = None;
                        return Ok(InputEvent::Aligned(b));
                    }
                }
                Message::End => {
                    self.ended[input] = true;
                    if self.ended.iter().all(|e| *e) {
                        return Ok(InputEvent::AllEnded);
                    }
                    if let Some(b) = self.aligning.filter(|_| self.aligned()) {
                        self.blocked.iter_mut().for_each(|b| *b = false);
                        self.aligning = None;
                        return Ok(InputEvent::Aligned(b));
                    }
                }
            }
        }
    }
}

/// Everything a subtask needs to run.
pub(crate) struct TaskIo {
    pub(crate) ctx: SubtaskContext,
    pub(crate) node: usize,
    pub(crate) restored: StateItems,
    pub(crate) out: Collector,
    pub(crate) control: mpsc::UnboundedReceiver<Control>,
    pub(crate) report: mpsc::UnboundedSender<Report>,
    pub(crate) metrics: Arc<OperatorMetrics>,
}

async fn operator_control(op: &mut Box<dyn Operator>, control: Control) -> Result<()> {
    match control {
        Control::Complete(n) => op.notify_checkpoint_complete(n).await,
        Control::Aborted(n) => op.notify_checkpoint_aborted(n).await,
    }
}

async fn source_control(source: &mut Box<dyn Source>, control: Control) -> Result<()> {
    match control {
        Control::Complete(n) => source.notify_checkpoint_complete(n).await,
        Control::Aborted(n) => source.notify_checkpoint_aborted(n).await,
    }
}

/// Runs an operator subtask until its inputs end or it fails.
pub(crate) async fn run_operator(mut op: Box<dyn Operator>, mut inputs: Inputs, mut io: TaskIo) -> Result<()> {
    let task = io.ctx.task_name();
    op.open(&io.ctx, std::mem::take(&mut io.restored)).await?;
    loop {
        tokio::select! {
            biased;
            Some(control) = io.control.recv() => operator_control(&mut op, control).await?,
            event = inputs.next(&task) => match event? {
                InputEvent::Batch(input, batch) => {
                    io.metrics.add_rows_in(batch.num_rows() as u64);
                    op.process_batch(batch, input, &mut io.out).await?;
                }
                InputEvent::Aligned(barrier) => {
                    tracing::trace!(task = %task, checkpoint = barrier.checkpoint_id, "snapshot");
                    if let Some(watermark) = inputs.take_watermark() {
                        op.on_watermark(watermark).await?;
                    }
                    if barrier.end_of_input {
                        // The inputs ended: no later event time can come (Flink's final
                        // watermark), so every window closes in this checkpoint.
                        op.on_watermark(i64::MAX).await?;
                    }
                    let state = op.snapshot_state(barrier.checkpoint_id, &mut io.out).await?;
                    io.out.barrier_passed(barrier.checkpoint_id);
                    let _ = io.report.send(Report::Ack { checkpoint_id: barrier.checkpoint_id, node: io.node, subtask: io.ctx.subtask, state });
                    io.out.broadcast(Message::Barrier(barrier)).await?;
                }
                InputEvent::AllEnded => {
                    op.close(&mut io.out).await?;
                    io.out.broadcast(Message::End).await?;
                    let _ = io.report.send(Report::Finished);
                    // The final checkpoint's notifications come after; the coordinator
                    // closes the channel when there are no more.
                    while let Some(control) = io.control.recv().await {
                        operator_control(&mut op, control).await?;
                    }
                    return Ok(());
                }
            }
        }
    }
}

/// How long an idle source waits before polling again.
const IDLE_WAIT: Duration = Duration::from_millis(1);

/// How long a failed attempt's source may take to [abandon](Source::abandon) its clients.
pub(crate) const ABANDON_LIMIT: Duration = Duration::from_secs(5);

/// Runs a source subtask until it ends, fails, or `cancel` turns true (the attempt
/// failed elsewhere). A failed or cancelled source stops where it is, as in a crash,
/// and then [abandons](Source::abandon) its clients, for at most [`ABANDON_LIMIT`].
pub(crate) async fn run_source(
    mut source: Box<dyn Source>,
    triggers: mpsc::UnboundedReceiver<Barrier>,
    io: TaskIo,
    mut cancel: tokio::sync::watch::Receiver<bool>,
) -> Result<()> {
    let task = io.ctx.task_name();
    let result = tokio::select! {
        r = drive_source(&mut source, triggers, io) => r,
        // A sender dropped without cancelling (the attempt ended well) cancels nothing.
        _ = async { if cancel.wait_for(|c| *c).await.is_err() { std::future::pending::<()>().await } } => Ok(()),
    };
    let ended = matches!(result, Ok(())) && !*cancel.borrow();
    if !ended {
        match tokio::time::timeout(ABANDON_LIMIT, source.abandon()).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::debug!(task = %task, error = %e, "abandoning the source failed"),
            Err(_) => tracing::debug!(task = %task, "abandoning the source took longer than {ABANDON_LIMIT:?}"),
        }
    }
    result
}

/// Polls `source` and emits barriers when the coordinator triggers, until the final
/// checkpoint's notifications are done.
async fn drive_source(
    source: &mut Box<dyn Source>,
    mut triggers: mpsc::UnboundedReceiver<Barrier>,
    mut io: TaskIo,
) -> Result<()> {
    source.open(&io.ctx, std::mem::take(&mut io.restored)).await?;
    let mut finished = false;
    let mut trigger: Option<Barrier> = None;
    loop {
        while let Ok(c) = io.control.try_recv() {
            source_control(source, c).await?;
        }
        if trigger.is_none() {
            trigger = triggers.try_recv().ok();
        }
        if let Some(barrier) = trigger.take() {
            let state = source.snapshot_state(barrier.checkpoint_id).await?;
            let _ = io.report.send(Report::Ack {
                checkpoint_id: barrier.checkpoint_id,
                node: io.node,
                subtask: io.ctx.subtask,
                state,
            });
            io.out.broadcast(Message::Barrier(barrier)).await?;
            io.out.barrier_passed(barrier.checkpoint_id);
            if barrier.is_final {
                io.out.broadcast(Message::End).await?;
                let _ = io.report.send(Report::Finished);
                // The final checkpoint's completion comes after; the coordinator closes
                // the channel when there is nothing more.
                while let Some(c) = io.control.recv().await {
                    source_control(source, c).await?;
                }
                return source.close().await;
            }
            continue;
        }
        if finished {
            tokio::select! {
                t = triggers.recv() => trigger = t,
                Some(c) = io.control.recv() => source_control(source, c).await?,
            }
            continue;
        }
        match source.poll_next(io.out.checkpoint_id()).await? {
            SourceEvent::Batch(batch) => {
                io.metrics.add_rows_in(batch.num_rows() as u64);
                io.out.emit(batch).await?;
            }
            SourceEvent::Idle => {
                tokio::select! {
                    t = triggers.recv() => trigger = t,
                    _ = tokio::time::sleep(IDLE_WAIT) => {}
                }
            }
            SourceEvent::Finished => {
                finished = true;
                let _ = io.report.send(Report::SourceFinished);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::Int64Array;
    use arrow::datatypes::{DataType, Field, Schema};

    use super::*;

    fn batch(v: i64) -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![Field::new("v", DataType::Int64, false)]));
        RecordBatch::try_new(schema, vec![Arc::new(Int64Array::from(vec![v]))]).unwrap()
    }

    fn value(e: &InputEvent) -> String {
        match e {
            InputEvent::Batch(input, b) => {
                format!("{input}:{}", b.column(0).as_any().downcast_ref::<Int64Array>().unwrap().value(0))
            }
            InputEvent::Aligned(b) => format!("aligned {}", b.checkpoint_id),
            InputEvent::AllEnded => "end".into(),
        }
    }

    /// Input 0 delivers barrier 1 early; its later batch must wait until input 1 also
    /// delivered barrier 1, while input 1's batches before its barrier flow through.
    #[tokio::test]
    async fn two_inputs_align_on_a_barrier() {
        let (tx, rx) = mpsc::channel(16);
        let barrier = Barrier { checkpoint_id: 1, is_final: false, end_of_input: false };
        let send = |input, message| tx.try_send(Tagged { input, message }).unwrap();
        send(0, Message::Batch(batch(1)));
        send(0, Message::Barrier(barrier));
        send(0, Message::Batch(batch(2))); // after the barrier: held back
        send(1, Message::Batch(batch(10)));
        send(1, Message::Batch(batch(11)));
        send(1, Message::Barrier(barrier));
        send(1, Message::Batch(batch(12)));
        send(0, Message::End);
        send(1, Message::End);
        let mut inputs = Inputs::new(rx, 2, vec![0, 1]);
        let mut seen = Vec::new();
        loop {
            let e = inputs.next("t").await.unwrap();
            let end = matches!(e, InputEvent::AllEnded);
            seen.push(value(&e));
            if end {
                break;
            }
        }
        let aligned_at = seen.iter().position(|s| s == "aligned 1").unwrap();
        let before: Vec<&String> = seen[..aligned_at].iter().collect();
        assert!(
            before.contains(&&"0:1".to_string())
                && before.contains(&&"1:10".to_string())
                && before.contains(&&"1:11".to_string()),
            "{seen:?}"
        );
        assert!(
            seen[aligned_at..].contains(&"0:2".to_string()) && seen[aligned_at..].contains(&"1:12".to_string()),
            "{seen:?}"
        );
        assert_eq!(seen.last().unwrap(), "end");
    }

    #[tokio::test]
    async fn an_out_of_order_barrier_is_an_error() {
        let (tx, rx) = mpsc::channel(16);
        tx.try_send(Tagged {
            input: 0,
            message: Message::Barrier(Barrier { checkpoint_id: 1, is_final: false, end_of_input: false }),
        })
        .unwrap();
        tx.try_send(Tagged {
            input: 1,
            message: Message::Barrier(Barrier { checkpoint_id: 2, is_final: false, end_of_input: false }),
        })
        .unwrap();
        let mut inputs = Inputs::new(rx, 2, vec![0, 1]);
        assert!(inputs.next("t").await.is_err());
    }

    #[tokio::test]
    async fn the_watermark_is_the_minimum_of_live_inputs_and_the_newest_once_all_are_idle() {
        let (tx, rx) = mpsc::channel(64);
        let mut inputs = Inputs::new(rx, 2, vec![0, 0]);
        let barrier = |n| Message::Barrier(Barrier { checkpoint_id: n, is_final: false, end_of_input: false });
        // (watermarks of inputs 0 and 1 in the period, the aligned watermark)
        let table: [(Option<i64>, Option<i64>, Option<i64>); 5] = [
            (Some(5), Some(9), Some(5)),
            (None, Some(12), Some(12)),             // input 0 idle: it holds nothing back
            (None, None, Some(12)),                 // both idle: the newest of their last ones
            (Some(7), None, Some(7)),               // input 0 back, lower: the operator keeps its own maximum
            (Some(HOLD_WATERMARK), Some(20), None), // input 0 without rows yet holds it
        ];
        for (n, (a, b, want)) in table.into_iter().enumerate() {
            for (input, w) in [(0, a), (1, b)] {
                tx.try_send(Tagged { input, message: Message::Watermark(w) }).unwrap();
                tx.try_send(Tagged { input, message: barrier(n as u64 + 1) }).unwrap();
            }
            assert!(matches!(inputs.next("t").await.unwrap(), InputEvent::Aligned(_)));
            assert_eq!(inputs.take_watermark(), want, "period {n}");
        }
    }
}
