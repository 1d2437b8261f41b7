r"""The pre-training data builder as an Apache Beam pipeline (`create_pretraining_data --runner=`).

  python -m data_pipelines.create_pretraining_data --runner=DataflowRunner \
    --project=PROJECT --region=us-central1 --temp_location=gs://BUCKET/tmp \
    --setup_file=./pyproject.toml \
    --input_file='gs://BUCKET/corpus/*.txt' --output_file=gs://BUCKET/records/train.tfrecord@256 \
    --vocab_file=gs://BUCKET/vocab.txt --max_seq_length=128 --dupe_factor=10

The single-machine builder's run (`data_pipelines/create_pretraining_data/`), stage for stage,
and its records, file for file:
  1. read: each input file (or tensorflow-datasets shard) is read by one worker, with the same
     reader (bad lines replaced, cut and counted), its documents numbered;
  2. blocks: the documents numbered across all inputs and grouped into the same blocks of
     `--documents_per_block`, so a random-next B and a block's seed are unchanged;
  3. instances: each block by `BlockBuilder.records`, the one implementation of the algorithm
     (masking by `data_pipelines/masking.py`), each record keyed by its shuffle bucket;
  4. shuffle: each bucket grouped (GroupByKey), put back in block order, shuffled in memory by
     `shuffle_bucket` and dealt round-robin to the outputs from where the buckets before it
     ended, one temporary piece file per output beside the outputs;
  5. write: each output file is its pieces concatenated in bucket order (TFRecord files
     concatenate), so output i holds the records, in the order, that the single-machine builder
     writes to output i; written in `.NAME.partial/` beside the outputs and moved into place
     once the pipeline is done (a killed run leaves no half-written output; a rerun starts
     afresh).
Not `beam.io.WriteToTFRecord`: it deals records to shards in arrival order (a partial shuffle
that depends on the runner) and names files only as PATH-SSSSS-of-NNNNN; this way every output
spec (`PATH@N` or a comma list) and the single-machine bytes come out on every runner.

Statistics: every count is a Beam counter (namespace `create_pretraining_data`, summed over
steps by `counters`), and the exact `Stats` (the first bad lines in input order) are combined in
the pipeline, printed and returned as on one machine. Paths: local, or any URL of the project's
filesystem layer (`gs://`); workers must reach them (on Dataflow: all on gs://). Memory per
worker: one block, or one bucket (`--shuffle_bucket_mb`), as on one machine.
"""
import dataclasses
import json
import logging
import re
import shutil
import time
from typing import Dict, List, Optional, Sequence, Tuple

import apache_beam as beam
from apache_beam.metrics import Metrics
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions
from apache_beam.runners.runner import PipelineState

from bert_jax.io import filesystem
from data_pipelines import create_pretraining_data as cpd

NAMESPACE = "create_pretraining_data"  # of the Beam counters
COUNTED = tuple(f.name for f in dataclasses.fields(cpd.Stats) if f.name != "bad_line_locations")
_STATS = "stats"
_DOCUMENT_COUNTS = "document_counts"


@dataclasses.dataclass(frozen=True)
class Source:
  """What one worker reads: an input file, or a slice of a tensorflow-datasets split."""
  index: int               # its place in the input order (documents are numbered in that order)
  path: str = ""
  tfds_split: str = ""


@dataclasses.dataclass(frozen=True)
class TfdsInput:
  """The tensorflow-datasets flags every reader shares (`--tfds_name`, ...)."""
  name: str
  text_field: str
  data_dir: Optional[str]


def tfds_slices(split: str, shard_lengths: Sequence[int]) -> List[str]:
  """`split` cut at its shard boundaries (`train[0:3650]`, ...): one TFDS shard file per worker,
  and the slices in order are the split in order (read with shuffle_files=False)."""
  slices, start = [], 0
  for length in shard_lengths:
    if length:
      slices.append(f"{split}[{start}:{start + length}]")
    start += length
  return slices


def _tfds_sources(name: str, split: str, data_dir: Optional[str]) -> List[Source]:
  """A prepared split (a plain name such as `train`) in shard slices; otherwise (a sub-split
  such as `train[:10%]`, or a dataset not prepared yet, which one worker then prepares, not
  every worker at once) the split whole, read by one worker."""
  import tensorflow_datasets as tfds
  lengths: Sequence[int] = []
  if re.fullmatch(r"\w+", split):
    builder = tfds.builder(name, data_dir=data_dir)
    if builder.is_prepared() and split in builder.info.splits:
      lengths = builder.info.splits[split].shard_lengths
  splits = tfds_slices(split, lengths) if len(lengths) > 1 else [split]
  return [Source(i, tfds_split=s) for i, s in enumerate(splits)]


def _count(stats: cpd.Stats) -> None:
  for name in COUNTED:
    Metrics.counter(NAMESPACE, name).inc(getattr(stats, name))


def counters(result) -> Dict[str, int]:
  """The run's Beam counters, summed over the steps that count them (committed where the
  runner reports committed values, else attempted)."""
  totals: Dict[str, int] = {}
  for counter in result.metrics().query(MetricsFilter().with_namespace(NAMESPACE))["counters"]:
    value = counter.committed if counter.committed is not None else counter.attempted
    totals[counter.key.metric.name] = totals.get(counter.key.metric.name, 0) + value
  return totals


def _offsets(counts: Dict[int, int]) -> Dict[int, int]:
  """Key -> how many items the keys before it hold (keys in order)."""
  offsets, total = {}, 0
  for key in sorted(counts):
    offsets[key] = total
    total += counts[key]
  return offsets


# ------------------------------------------------------------------------------ the stages


class _ReadDocuments(beam.DoFn):
  """A source -> (source index, document number, document); its statistics and document count
  as side outputs."""

  def __init__(self, options: cpd.Options, tfds: Optional[TfdsInput]):
    self.options = options
    self.tfds = tfds

  def process(self, source: Source):
    stats = cpd.Stats()
    if source.path:
      documents = cpd.documents_from_files([source.path], self.options, stats)
    else:
      documents = cpd.documents_from_tfds(self.tfds.name, source.tfds_split,
                                          self.tfds.text_field, self.tfds.data_dir, stats)
    number = 0
    for document in documents:
      yield source.index, number, document
      number += 1
    _count(stats)
    yield beam.pvalue.TaggedOutput(_DOCUMENT_COUNTS, (source.index, number))
    yield beam.pvalue.TaggedOutput(_STATS, (source.index, stats))


def _key_by_block(numbered, offsets: Dict[int, int], documents_per_block: int):
  """The single-machine blocks: consecutive runs of documents in input order."""
  source_index, number, document = numbered
  index = offsets[source_index] + number
  return index // documents_per_block, (index, document)


class _MakeInstances(beam.DoFn):
  """A block -> (bucket, (block index, position, record)) by `BlockBuilder.records`."""

  def __init__(self, tokenizer_kwargs: dict, options: cpd.Options, num_buckets: int):
    self.tokenizer_kwargs = tokenizer_kwargs
    self.options = options
    self.num_buckets = num_buckets
    self.builder = None

  def setup(self):
    self.builder = cpd.worker_block_builder(self.tokenizer_kwargs, self.options,
                                            self.num_buckets)

  def process(self, block):
    block_index, numbered = block
    documents = [document for _, document in sorted(numbered, key=lambda item: item[0])]
    stats = cpd.Stats()
    records = self.builder.records(block_index, documents, stats)
    for position, (bucket, record) in enumerate(records):
      yield bucket, (block_index, position, record)
    _count(stats)
    yield beam.pvalue.TaggedOutput(_STATS, (-1, stats))  # no bad-line locations here


def piece_path(work_dir: str, output: int, bucket: int) -> str:
  return filesystem.join(work_dir, f"output-{output:05d}-bucket-{bucket:05d}.tfrecord")


class _WriteBucketPieces(beam.DoFn):
  """A bucket -> one temporary piece file per output: (output, (bucket, path, records))."""

  def __init__(self, work_dir: str, num_outputs: int, seed: int):
    self.work_dir = work_dir
    self.num_outputs = num_outputs
    self.seed = seed

  def process(self, keyed, bucket_offsets: Dict[int, int]):
    bucket, items = keyed
    # Block order, each block's records in the order made: what the single-machine builder
    # reads back from its bucket files before shuffling.
    records = [record for _, _, record in sorted(items, key=lambda item: item[:2])]
    cpd.shuffle_bucket(records, self.seed, bucket)
    start = bucket_offsets[bucket]  # records of the run dealt before this bucket
    for output in range(self.num_outputs):
      # Record k of the run goes to output k % num_outputs, as on one machine.
      piece = records[(output - start) % self.num_outputs::self.num_outputs]
      if not piece:
        continue
      path = piece_path(self.work_dir, output, bucket)
      with filesystem.RecordWriter(path) as writer:  # a retried bundle rewrites the same bytes
        for record in piece:
          writer.write(record)
      yield output, (bucket, path, len(piece))


def concatenated_path(work_dir: str, output: int) -> str:
  """Where output `output` is written before the run moves it into place."""
  return filesystem.join(work_dir, f"output-{output:05d}.tfrecord")


class _ConcatenatePieces(beam.DoFn):
  """An output file = its pieces in bucket order (a TFRecord file is its records' framing end to
  end, so the concatenation is one valid file), written in the work directory: the driver moves
  the outputs into place once the whole pipeline is done."""

  def __init__(self, work_dir: str):
    self.work_dir = work_dir

  def process(self, keyed):
    output, pieces = keyed
    with filesystem.open(concatenated_path(self.work_dir, output), "wb") as out:
      for _, path, _ in sorted(pieces):
        with filesystem.open(path, "rb") as piece:
          shutil.copyfileobj(piece, out, 1 << 22)


class _CombineStats(beam.CombineFn):
  """Sums `Stats`; the bad-line locations kept are the first in input order, source by source,
  as the single-machine builder reports them."""

  def create_accumulator(self):
    return cpd.Stats(), {}

  def add_input(self, accumulator, keyed):
    total, locations = accumulator
    source_index, stats = keyed
    total.add(dataclasses.replace(stats, bad_line_locations=[]))
    if stats.bad_line_locations:
      locations[source_index] = list(stats.bad_line_locations)
    return accumulator

  def merge_accumulators(self, accumulators):
    total, locations = self.create_accumulator()
    for stats, more in accumulators:
      total.add(stats)
      locations.update(more)
    return total, locations

  def extract_output(self, accumulator):
    total, locations = accumulator
    total.add(cpd.Stats(bad_line_locations=[where for key in sorted(locations)
                                            for where in locations[key]]))
    return total


def _write_summary(stats: cpd.Stats, path: str, written: int) -> None:
  filesystem.write_text(path, json.dumps({"written": written,
                                          "stats": dataclasses.asdict(stats)}))


# ------------------------------------------------------------------------------ the pipeline


def pipeline_options(args: Sequence[str]) -> PipelineOptions:
  """Beam's options from the flags create_pretraining_data does not define. An option no
  installed runner knows fails here, naming it (Beam would drop it with a log line)."""
  options = PipelineOptions(list(args))
  known = options.get_all_options(drop_default=True)
  everything = options.get_all_options(drop_default=True, retain_unknown_options=True)
  unknown = sorted(set(everything) - set(known))
  if unknown:
    raise ValueError("Unknown flag(s) " + ", ".join(f"--{name}" for name in unknown) +
                     ": neither a create_pretraining_data flag nor a Beam pipeline option")
  return options


def _quiet_beam_logs() -> None:
  """absl shows INFO logs, and Beam's INFO is worker and bundle chatter (a plain Beam program
  would show WARNING and up). The Dataflow runner's INFO (job id, console link) stays."""
  logging.getLogger("apache_beam").setLevel(logging.WARNING)
  logging.getLogger("apache_beam.runners.dataflow").setLevel(logging.INFO)


def build_pipeline(pipeline: beam.Pipeline, sources: Sequence[Source], plan: cpd.RunPlan,
                   tokenizer_kwargs: dict, tfds: Optional[TfdsInput], work_dir: str,
                   summary_path: str) -> None:
  """The five stages (module docstring) on `pipeline`; the summary JSON at `summary_path`."""
  opts = plan.options
  read = (pipeline
          | "Sources" >> beam.Create(list(sources))
          | "SpreadSources" >> beam.Reshuffle()  # one source per worker, not one bundle
          | "Read" >> beam.ParDo(_ReadDocuments(opts, tfds)).with_outputs(
              _STATS, _DOCUMENT_COUNTS, main="documents"))
  document_offsets = (read[_DOCUMENT_COUNTS]
                      | "DocumentCounts" >> beam.combiners.ToDict()
                      | "DocumentOffsets" >> beam.Map(_offsets))
  made = (read.documents
          | "KeyByBlock" >> beam.Map(_key_by_block, beam.pvalue.AsSingleton(document_offsets),
                                     opts.documents_per_block)
          | "GroupBlocks" >> beam.GroupByKey()
          | "Instances" >> beam.ParDo(_MakeInstances(tokenizer_kwargs, opts, plan.num_buckets))
          .with_outputs(_STATS, main="records"))
  bucket_offsets = (made.records
                    | "BucketSizes" >> beam.combiners.Count.PerKey()
                    | "BucketSizeDict" >> beam.combiners.ToDict()
                    | "BucketOffsets" >> beam.Map(_offsets))
  pieces = (made.records
            | "GroupBuckets" >> beam.GroupByKey()
            | "ShuffleBuckets" >> beam.ParDo(
                _WriteBucketPieces(work_dir, len(plan.output_files), opts.random_seed),
                beam.pvalue.AsSingleton(bucket_offsets)))
  _ = (pieces
       | "GroupOutputs" >> beam.GroupByKey()
       | "WriteOutputs" >> beam.ParDo(_ConcatenatePieces(work_dir)))
  written = (pieces
             | "PieceSizes" >> beam.Map(lambda piece: piece[1][2])
             | "Written" >> beam.CombineGlobally(sum))
  _ = ((read[_STATS], made[_STATS])
       | "AllStats" >> beam.Flatten()
       | "CombineStats" >> beam.CombineGlobally(_CombineStats())
       | "Summary" >> beam.Map(_write_summary, summary_path, beam.pvalue.AsSingleton(written)))


def _check_reachable(runner: str, paths: Sequence[str]) -> None:
  """Dataflow's workers are other machines: a local input or output path is an error now, not
  a missing file on a worker later."""
  if "dataflow" in runner.lower():
    local = [p for p in paths if not filesystem.is_url(p)]
    if local:
      raise ValueError(f"--runner={runner}: workers cannot reach the local path(s) "
                       f"{', '.join(local)}; use gs:// paths")


def _shipped_tokenizer(tokenizer, work_dir: str) -> dict:
  """The tokenizer's arguments for the workers, with a local vocabulary / SentencePiece model /
  tokenizer.json copied into the work directory when that is a URL (so a local vocab.txt works on
  Dataflow)."""
  kwargs = cpd.tokenizer_kwargs(tokenizer)
  for key in ("vocab_file", "spm_model_file", "tokenizer_file"):
    if kwargs.get(key) and filesystem.is_url(work_dir) and not filesystem.is_url(kwargs[key]):
      if key == "tokenizer_file":   # one tokenizer.json (RoBERTa's vocab.json needs its merges)
        shipped = filesystem.join(work_dir, "tokenizer.json")
        filesystem.write_text(shipped, tokenizer.tokenizer_json())
      else:
        shipped = filesystem.join(work_dir, filesystem.basename(kwargs[key]))
        filesystem.copy(kwargs[key], shipped)
      kwargs[key] = shipped
  return kwargs


def run(input_files: Sequence[str], output_files: Sequence[str], tokenizer, *,
        pipeline_args: Sequence[str], tfds_name: str = "", tfds_split: str = "train",
        tfds_text_field: str = "text", tfds_data_dir: Optional[str] = None,
        **options) -> Tuple[cpd.Stats, int, object]:
  """Runs the pipeline to the end: (statistics, records written, Beam's PipelineResult)."""
  beam_options = pipeline_options(pipeline_args)
  _check_reachable(beam_options.view_as(StandardOptions).runner or "",
                   [p for p in input_files if p and not tfds_name] + list(output_files))
  plan = cpd.plan_run(input_files, output_files, tokenizer, tfds_name, **options)
  # Workers elsewhere (another process, machine or cluster) resolve no relative path.
  plan = dataclasses.replace(plan, output_files=[filesystem.absolute(p)
                                                 for p in plan.output_files])
  if tfds_name:
    tfds = TfdsInput(tfds_name, tfds_text_field, tfds_data_dir)
    sources = _tfds_sources(tfds_name, tfds_split, tfds_data_dir)
  else:
    tfds = None
    sources = [Source(i, path=filesystem.absolute(p)) for i, p in enumerate(plan.input_files)]
  _quiet_beam_logs()
  # Temporary pieces, outputs and the summary beside the outputs: every worker can write there.
  # The directory is the single-machine builder's: a rerun after a kill starts it afresh.
  work_dir = cpd.partial_directory(plan.output_files)
  if filesystem.exists(work_dir):
    filesystem.rmtree(work_dir)
  filesystem.makedirs(work_dir)
  summary_path = filesystem.join(work_dir, "summary.json")
  with cpd.full_disk_named(plan.output_files, work_dir):
    try:
      pipeline = beam.Pipeline(options=beam_options)
      build_pipeline(pipeline, sources, plan, _shipped_tokenizer(tokenizer, work_dir), tfds,
                     work_dir, summary_path)
      result = pipeline.run()
      state = result.wait_until_finish()
      if state not in (None, PipelineState.DONE):
        raise RuntimeError(f"The Beam pipeline ended {state}, not DONE")
      if not filesystem.exists(summary_path):
        raise RuntimeError(f"The Beam pipeline finished without its summary {summary_path}")
      summary = json.loads(filesystem.read_text(summary_path))
      cpd.check_instances(cpd.Stats(**summary["stats"]),
                          plan.input_files or [tfds_name], summary["written"])
      for output, path in enumerate(plan.output_files):   # each output appears whole, at the end
        filesystem.rename(concatenated_path(work_dir, output), path)
    finally:
      if filesystem.exists(work_dir):
        filesystem.rmtree(work_dir)
  return cpd.Stats(**summary["stats"]), summary["written"], result


def create_pretraining_data(input_files: Sequence[str], output_files: Sequence[str], tokenizer,
                            *, pipeline_args: Sequence[str], progress: bool = True,
                            **kwargs) -> cpd.Stats:
  """`create_pretraining_data.create_pretraining_data` as a Beam pipeline: the same arguments
  (less num_workers), plus Beam's pipeline options as flags (`--runner=DirectRunner`, ...)."""
  started = time.time()
  stats, written, _ = run(input_files, output_files, tokenizer, pipeline_args=pipeline_args,
                          **kwargs)
  cpd.finish(stats, written, len(output_files), time.time() - started, progress)
  return stats

