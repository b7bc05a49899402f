//! [`KafkaTransactions`] as the runtime's participant: the steps of a checkpoint (begin,
//! prepare, commit, abort), recovery's view of pending transactions, fencing and
//! take-over, carried out on Kafka.

use super::*;

#[async_trait]
impl TransactionParticipant for KafkaTransactions {
    fn name(&self) -> &str {
        NAME
    }

    /// The transaction timeout must outlast a checkpoint and fit the broker's maximum.
    async fn validate(&self, checkpoint_interval: Option<Duration>, checkpoint_timeout: Duration) -> Result<()> {
        if !self.config.exactly_once {
            return Ok(());
        }
        KafkaTransactions::validate(self, checkpoint_interval.unwrap_or_default(), checkpoint_timeout)
            .await
            .map_err(|e| runtime_error(NAME, e))
    }

    /// The checks of `validate`, then the slot pool against the job: one attempt keeps
    /// up to `tolerable_checkpoint_failures + 2` transactions open, each on a slot of
    /// its own.
    async fn validate_job(&self, job: &JobSettings) -> Result<()> {
        TransactionParticipant::validate(self, job.checkpoint_interval, job.checkpoint_timeout).await?;
        if self.config.exactly_once {
            check_slots(self.config.slots, job).map_err(|e| runtime_error(NAME, e))?;
        }
        match self.cluster.share_delivery_limit(&job.group).await {
            Ok(limit) => {
                if let Some(why) = job.restart.burns_deliveries(limit) {
                    tracing::warn!(group = %job.group, "{why}");
                }
            }
            Err(e) => tracing::debug!(group = %job.group, error = %e, "cannot read the group's delivery limit"),
        }
        Ok(())
    }

    async fn open(&self, template: &TransactionTemplate) -> Result<()> {
        if !self.owner {
            // An adopter: it only decides the adopted prefix's transactions.
            *lock(&self.template) = Some(template.clone());
            lock(&self.recovered).clear();
            if self.config.exactly_once {
                self.scan_open(template, false).await?;
            }
            return Ok(());
        }
        let previous = lock(&self.template).clone();
        if let Some(previous) = &previous {
            self.retire_attempt(previous).await?;
        }
        // No generation is current while the last attempt's transactions are scanned.
        let previous_generation = std::mem::take(&mut *lock(&self.generation));
        *lock(&self.template) = Some(template.clone());
        let (intents, commits) = (intents_topic(template.group_id()), commits_topic(template));
        // One partition each, kept until compaction trims it: entries are needed until
        // replayed, and one partition totally orders the claims.
        for topic in [&intents, &commits] {
            self.cluster.ensure_topic(topic, 1, LEDGER_TOPIC_CONFIGS).await.map_err(rt)?;
        }
        self.group.start(&intents);
        self.group.catch_up(TAIL_TIMEOUT).await.map_err(rt)?;
        // Every id of an earlier attempt that carries no open transaction is fenced now:
        // a paused process of this prefix can begin nothing more on it. What the last
        // attempt left open and never prepared can never commit, so it is aborted too;
        // prepared ones wait for recovery's decision, and `take_over` fences them after.
        let listed = if self.config.exactly_once { self.listed(template, &[]).await? } else { Vec::new() };
        if self.config.exactly_once {
            let idle: Vec<String> =
                listed.iter().filter(|(_, _, _, st)| *st != KafkaTxnState::Ongoing).map(|l| l.0.clone()).collect();
            self.fence_all(&idle).await.map_err(rt)?;
            self.scan_open(template, false).await?;
        }
        // A generation above every one this prefix used: its ids are fresh.
        let written = self.log.commits(&commits, false).await.map_err(rt)?;
        *lock(&self.highest_commit) = written.iter().map(|(_, e, _)| *e).max();
        let (intent_gen, _) = self.group.highest(template.prefix());
        let generation = [
            written.iter().map(|(g, _, _)| *g).max(),
            intent_gen,
            listed.iter().map(|(_, g, _, _)| *g).max(),
            Some(previous_generation),
        ]
        .into_iter()
        .flatten()
        .max()
        .unwrap_or(0)
            + 1;
        *lock(&self.generation) = generation;
        self.group.set_me(Claimant::new(template.prefix(), generation));
        if self.config.exactly_once {
            // Every slot is initialised now, before the runtime checks that nobody
            // adopted us: an adopter that fences us later fences these (rule R1).
            let ids: Vec<String> = (0..self.config.slots).map(|s| slot_id(template, generation, s)).collect();
            let producers = futures::future::join_all(ids.iter().map(|id| {
                self.cluster
                    .client()
                    .producer()
                    .transaction_timeout(self.config.transaction_timeout)
                    .linger(OUTPUT_LINGER)
                    .batch_size(OUTPUT_BATCH_BYTES)
                    .build_transactional(id.clone())
            }))
            .await;
            let mut slots = Vec::with_capacity(producers.len());
            for (id, p) in ids.iter().zip(producers) {
                slots.push(Arc::new(
                    p.map_err(|e| rt(kafka_error(format!("initialise the transactional id {id}"), e)))?,
                ));
            }
            *lock(&self.slots) = slots;
        }
        tracing::info!(prefix = %template.prefix(), generation, "kafka attempt opened");
        Ok(())
    }

    async fn begin(&self, txn: &TransactionId) -> Result<()> {
        if !self.config.exactly_once {
            return Ok(());
        }
        let n = txn.checkpoint_id();
        if lock(&self.live).contains_key(&n) {
            return Ok(());
        }
        let open: Vec<CheckpointId> = lock(&self.live).keys().copied().collect();
        let slot = slot_for(n, self.config.slots, open).map_err(|m| {
            failed(
                "begin",
                txn,
                Error::kafka(
                    format!("begin {txn}"),
                    format!(
                        "its slot {} still carries T({m}), which has not committed: more checkpoints failed in a \
                         row than the {} slots allow; restarting",
                        n % u64::from(self.config.slots),
                        self.config.slots
                    ),
                    ErrorKind::Unavailable,
                ),
            )
        })?;
        let producer = self.slot_producer(slot)?;
        producer.begin().map_err(|e| failed("begin", txn, kafka_error(format!("begin {txn}"), e)))?;
        lock(&self.live).insert(n, Live { slot, handles: Vec::new(), prepared: false });
        Ok(())
    }

    async fn prepare(&self, txn: &TransactionId) -> Result<PrepareOutcome> {
        let n = txn.checkpoint_id();
        if !self.config.exactly_once {
            let handles = std::mem::take(&mut *lock(&self.plain_handles));
            await_all(handles, "output").await.map_err(|e| failed("prepare", txn, e))?;
            return Ok(PrepareOutcome::Prepared);
        }
        let live = lock(&self.live).get_mut(&n).map(|l| (l.slot, std::mem::take(&mut l.handles)));
        let Some((slot, mut handles)) = live else {
            return self.prepare_not_live(txn).await;
        };
        let producer = self.slot_producer(slot)?;
        // Ordered claims: once the tailer has passed our intents of checkpoint n, any
        // offset another instance claimed first is lost, and T(n) must not commit.
        let intents = lock(&self.intents).get(&n).map(|e| (e.ranges.clone(), e.last_offset));
        if let Some((ranges, last)) = intents {
            self.group.wait_past(last, TAIL_TIMEOUT).await.map_err(|e| failed("prepare", txn, e))?;
            let lost = self.group.lost(&ranges).map_err(|e| failed("prepare", txn, e))?;
            if !lost.is_empty() {
                tracing::warn!(
                    %txn,
                    ranges = ?lost,
                    "another instance claimed some of this checkpoint's records first; aborting its transaction"
                );
                lock(&self.live).remove(&n);
                lock(&self.intents).remove(&n);
                let _ = producer.abort().await;
                return Ok(PrepareOutcome::AlreadyAborted);
            }
        }
        // The commit entry rides in T(n): visible exactly when the output is.
        let entry = LedgerEntry::Commit { generation: self.generation(), checkpoint_id: n, slot };
        let entry = LedgerLog::record(&self.ledger_topic()?, &entry).map_err(|e| failed("prepare", txn, e))?;
        let p = &*producer;
        let enqueued = enqueue_all(vec![entry], &format!(" in {txn}"), |r| p.enqueue(r)).await;
        handles.extend(enqueued.map_err(|e| failed("prepare", txn, e))?);
        await_all(handles, &format!("the output of {txn}")).await.map_err(|e| failed("prepare", txn, e))?;
        producer.flush().await.map_err(|e| failed("prepare", txn, kafka_error(format!("flush {txn}"), e)))?;
        if let Some(l) = lock(&self.live).get_mut(&n) {
            l.prepared = true;
        }
        Ok(PrepareOutcome::Prepared)
    }

    async fn commit(&self, txn: &TransactionId) -> Result<()> {
        let n = txn.checkpoint_id();
        if !self.config.exactly_once {
            // At-least-once: the commit entry is written after the checkpoint; a crash
            // before it replays checkpoint n (duplicates, never loss).
            let entry = LedgerEntry::Commit { generation: self.generation(), checkpoint_id: n, slot: 0 };
            let written = self.log.write(&self.ledger_topic()?, &entry).await;
            lock(&self.intents).remove(&n);
            written.map_err(|e| failed("commit", txn, e))?;
            self.after_commit(n);
            return Ok(());
        }
        let live = lock(&self.live).remove(&n);
        if let Some(l) = live {
            let producer = self.slot_producer(l.slot)?;
            if let Err(e) = producer.commit().await {
                // Its checkpoint completed: it stays prepared, so that neither a new
                // attempt nor closing aborts it, and recovery commits it (through this
                // producer while the process lives, else by producer id and epoch).
                lock(&self.live).insert(n, l);
                return Err(failed("commit", txn, kafka_error(format!("commit {txn}"), e)));
            }
            lock(&self.intents).remove(&n);
            self.after_commit(n);
            return Ok(());
        }
        // Recovery: a crash left T(n) open after its checkpoint completed.
        let Some(id) = self.recovered_id(txn).await? else {
            tracing::warn!(%txn, "recovery: no open transaction carries it; it committed already, or the broker aborted it");
            return Ok(());
        };
        // An earlier attempt of this process prepared it: its own producer commits it.
        if let Some(producer) = self.take_held(&id) {
            match producer.commit().await {
                Ok(()) => {
                    tracing::info!(%txn, %id, "recovery: committed by the earlier attempt's producer");
                    tokio::spawn(close_producer(producer));
                    lock(&self.recovered).remove(&n);
                    return Ok(());
                }
                Err(e) => {
                    tracing::info!(%txn, %id, error = %e, "recovery: the earlier attempt's producer cannot commit; deciding by what the broker says")
                }
            }
        }
        let template = TransactionTemplate::new(txn.group_id(), txn.prefix())?;
        let described = self.cluster.describe_transaction(&id).await.map_err(|e| failed("commit", txn, e))?;
        match plan(Request::Commit, described.as_ref(), &commits_topic(&template)) {
            RecoveryAction::CommitByProducerId { producer_id, epoch } => {
                self.cluster.end_txn(&id, producer_id, epoch, true).await.map_err(|e| failed("commit", txn, e))?;
                tracing::info!(%txn, %id, producer_id, epoch, "recovery: committed by producer id and epoch");
            }
            RecoveryAction::AlreadyCommitted => {}
            RecoveryAction::Lost { state } => tracing::warn!(
                %txn,
                %id,
                state = ?state.as_ref().map(KafkaTxnState::as_str),
                "recovery: the broker already aborted this transaction (transaction timeout?); its output is lost \
                 and its records are replayed from the log through the ledger"
            ),
            other => return Err(plan_bug("commit", txn, &other)),
        }
        lock(&self.recovered).remove(&n);
        Ok(())
    }

    async fn abort(&self, txn: &TransactionId) -> Result<()> {
        if !self.config.exactly_once {
            return Ok(());
        }
        let n = txn.checkpoint_id();
        let live = lock(&self.live).remove(&n);
        if let Some(l) = live {
            // Its intents stay in the log; the next attempt replays them.
            lock(&self.intents).remove(&n);
            let producer = self.slot_producer(l.slot)?;
            return producer.abort().await.map_err(|e| failed("abort", txn, kafka_error(format!("abort {txn}"), e)));
        }
        // Recovery, or a repeated abort: an open transaction whose producer is gone is
        // aborted by fencing its id; one an earlier attempt of this process prepared, by
        // its own producer.
        let Some(id) = self.recovered_id(txn).await? else { return Ok(()) };
        if let Some(producer) = self.take_held(&id) {
            if producer.abort().await.is_ok() {
                tokio::spawn(close_producer(producer));
                lock(&self.recovered).remove(&n);
                return Ok(());
            }
        }
        let template = TransactionTemplate::new(txn.group_id(), txn.prefix())?;
        let described = self.cluster.describe_transaction(&id).await.map_err(|e| failed("abort", txn, e))?;
        match plan(Request::Abort, described.as_ref(), &commits_topic(&template)) {
            RecoveryAction::Fence => self.fence(&id).await.map_err(|e| failed("abort", txn, e))?,
            RecoveryAction::AlreadyAborted | RecoveryAction::AlreadyCommitted => {}
            other => return Err(plan_bug("abort", txn, &other)),
        }
        lock(&self.recovered).remove(&n);
        Ok(())
    }

    async fn pending(&self, template: &TransactionTemplate) -> Result<Vec<PendingTransaction>> {
        if !self.config.exactly_once {
            return Ok(Vec::new());
        }
        // Not opened for this prefix (a dry run of `txn resolve`): read only. Otherwise
        // `open` aborted what never prepared, and what shows up unprepared now is
        // aborted here too (nothing can decide it).
        let read_only = !self.owner && lock(&self.template).as_ref() != Some(template);
        let prepared = self.scan_open(template, read_only).await?;
        Ok(prepared.into_iter().map(|n| PendingTransaction { id: template.transaction(n), prepared: true }).collect())
    }

    fn adopter(&self) -> Option<Participant> {
        Some(Self::build(self.cluster.clone(), self.config.clone(), false))
    }

    /// Fences every transactional id of `template`'s prefix that could still commit
    /// (for our own prefix: every earlier generation's), reads which of its checkpoints
    /// committed, and queues the replay of whatever it holds that did not.
    async fn take_over(&self, template: &TransactionTemplate) -> Result<()> {
        if !self.owner {
            return Ok(());
        }
        let own = lock(&self.template).as_ref().is_some_and(|t| t.prefix() == template.prefix());
        if self.config.exactly_once {
            let current = self.generation();
            let ids: Vec<String> = self
                .listed(template, &[])
                .await?
                .into_iter()
                .filter(|(_, g, _, _)| !own || *g < current)
                .map(|(id, _, _, _)| id)
                .collect();
            self.fence_all(&ids).await.map_err(rt)?;
            lock(&self.held).retain(|id, _| !ids.contains(id));
            tracing::info!(prefix = %template.prefix(), fenced = ids.len(), "took over: every transactional id of the prefix is fenced");
        }
        // The replay plan needs the committed checkpoints of the prefix and of every prefix
        // that re-claimed its offsets (its adopter replayed them, that adopter's
        // adopter, ...), whatever order the prefixes are taken over in: without a
        // re-claimer's commits, work it already committed would be replayed again.
        self.group.catch_up(TAIL_TIMEOUT).await.map_err(rt)?;
        let prefix = template.prefix().to_string();
        let mut prefixes = self.group.reclaimers(&prefix);
        prefixes.insert(prefix.clone());
        let existing: BTreeSet<String> = self.cluster.topics().await.map_err(rt)?.into_iter().collect();
        let mine = lock(&self.template).as_ref().map(|t| t.prefix().to_string());
        let mut committed = Vec::new();
        for p in prefixes {
            let t = TransactionTemplate::new(template.group_id(), &p)?;
            let topic = commits_topic(&t);
            if !existing.contains(&topic) && mine.as_deref() != Some(p.as_str()) {
                // Deleted by `instances gc` or at retirement: the instance retired or its
                // adoption ended, and either way every commit of it has its commit note
                // in the intents topic by then, which is what the plan reads (decision 0036).
                tracing::info!(prefix = %p, %topic, "its ledger topic is gone (retired or adopted, then collected); its commit notes stand for it");
                continue;
            }
            let commits = self.log.commits(&topic, true).await.map_err(rt)?;
            committed.extend(commits.into_iter().map(|(g, e, _)| (Claimant::new(p.clone(), g), e)));
        }
        // Commit notes a crash lost (between a commit and its note), written again so
        // that every instance can count those intents done and the ledger can be trimmed.
        for (by, checkpoint_id) in self.group.unnoted(&committed) {
            self.group.write_note(by, checkpoint_id).await.map_err(rt)?;
        }
        let queued = self.group.hold((!own).then_some(prefix.as_str()), committed);
        tracing::info!(prefix = %template.prefix(), replay_ranges = queued, "took over the work of a prefix");
        Ok(())
    }

    /// T(n) committed exactly when its commit entry is in the commits topic, read
    /// committed (written inside T(n)). Trimming always keeps the last entry, so an
    /// empty topic means nothing committed; an id below its first entry was trimmed
    /// away, which only committed entries are, but this cannot be told apart: `None`.
    async fn committed(&self, txn: &TransactionId) -> Result<Option<bool>> {
        if !self.config.exactly_once {
            return Ok(None);
        }
        let template = TransactionTemplate::new(txn.group_id(), txn.prefix())?;
        let commits = self.log.commits(&commits_topic(&template), true).await.map_err(rt)?;
        let n = txn.checkpoint_id();
        if commits.iter().any(|(_, e, _)| *e == n) {
            return Ok(Some(true));
        }
        Ok(match commits.iter().map(|(_, e, _)| *e).min() {
            Some(first) if n < first => None,
            _ => Some(false),
        })
    }

    async fn highest_checkpoint_id(&self, template: &TransactionTemplate) -> Result<Option<CheckpointId>> {
        // Checkpoint ids are never reused within a prefix: above every one its intents
        // and commit entries name, open transactions included.
        self.group.catch_up(TAIL_TIMEOUT).await.map_err(rt)?;
        let (_, intents) = self.group.highest(template.prefix());
        Ok(intents.max(*lock(&self.highest_commit)))
    }

    async fn close(&self) -> Result<()> {
        self.close_clients().await;
        Ok(())
    }
}
