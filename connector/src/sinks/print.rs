//! [`PrintSink`]: prints rows to standard output, for examples.

use arrow::record_batch::RecordBatch;
use async_trait::async_trait;
use shareflow_runtime::{Collector, ErrorKind, Operator, Result, RuntimeError, SubtaskContext};

/// Prints every row, for examples.
pub struct PrintSink {
    prefix: String,
}

impl PrintSink {
    /// A factory for the job builder.
    pub fn factory(prefix: &str) -> impl Fn(&SubtaskContext) -> PrintSink + Send + Sync {
        let prefix = prefix.to_string();
        move |ctx| PrintSink { prefix: format!("{prefix}[{}]", ctx.subtask) }
    }
}

#[async_trait]
impl Operator for PrintSink {
    async fn process_batch(&mut self, batch: RecordBatch, _input: usize, _out: &mut Collector) -> Result<()> {
        let options = arrow::util::display::FormatOptions::default();
        let formatters: Vec<_> = batch
            .columns()
            .iter()
            .map(|c| arrow::util::display::ArrayFormatter::try_new(c.as_ref(), &options))
            .collect::<std::result::Result<_, _>>()
            .map_err(|e| RuntimeError::task("print", ErrorKind::Invalid, e))?;
        for row in 0..batch.num_rows() {
            let cells: Vec<String> = formatters.iter().map(|f| f.value(row).to_string()).collect();
            println!("{} {}", self.prefix, cells.join(" | "));
        }
        Ok(())
    }
}
