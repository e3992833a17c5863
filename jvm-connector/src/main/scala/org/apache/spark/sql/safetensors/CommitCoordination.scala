package org.apache.spark.sql.safetensors

import org.apache.spark.{SparkEnv, TaskContext}
import org.apache.spark.executor.CommitDeniedException

/** Spark's output commit coordinator (private[spark]) for the object-store commit
 *  (spec/dataset.md §5.6): at most one attempt of a partition may place its shards. */
object CommitCoordination {
  /** Returns normally when this task attempt may commit its partition's output; otherwise throws
   *  Spark's CommitDeniedException (the scheduler does not count it as a task failure). */
  def authorize(ctx: TaskContext, what: String): Unit = {
    val ok = SparkEnv.get.outputCommitCoordinator.canCommit(ctx.stageId(), ctx.stageAttemptNumber(),
      ctx.partitionId(), ctx.attemptNumber())
    if (!ok) {
      throw new CommitDeniedException(s"safetensors: attempt ${ctx.attemptNumber()} of partition " +
        s"${ctx.partitionId()} (stage ${ctx.stageId()}.${ctx.stageAttemptNumber()}) was not allowed to " +
        s"commit $what: another attempt commits it", ctx.stageId(), ctx.partitionId(), ctx.attemptNumber())
    }
  }
}
