// graphile-worker's wake, measured as `bf4ps-lab bench wake` measures ours:
// a job's insert returned to its client -> the job's task starts in a
// worker of the same process (concurrency 8, LISTEN/NOTIFY, 1 s poll).
// Usage: DATABASE_URL=... node wake.mjs SAMPLES
// Prints one JSON line: {"samples_ms": [...]}. Progress goes to stderr.
import { Logger, run, makeWorkerUtils } from "graphile-worker";

const connectionString = process.env.DATABASE_URL;
const samples = Number(process.argv[2] ?? 300);
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

const utils = await makeWorkerUtils({ connectionString });
await utils.migrate();
let started = null;
const runner = await run({
  connectionString,
  concurrency: 8,
  noHandleSignals: true,
  pollInterval: 1000,
  logger: new Logger(() => () => {}),
  taskList: {
    wake: async () => {
      const at = process.hrtime.bigint();
      if (started) started(at);
    },
  },
});
await sleep(300);
const out = [];
for (let i = 0; i < samples; i++) {
  const startedAt = new Promise((resolve) => (started = resolve));
  await utils.addJob("wake", { i });
  const added = process.hrtime.bigint();
  const at = await Promise.race([startedAt, sleep(10000).then(() => null)]);
  if (at === null) throw new Error(`job ${i} not started within 10 s`);
  out.push(Number(at - added) / 1e6);
  await sleep(2);
}
await runner.stop();
await utils.release();
process.stdout.write(JSON.stringify({ samples_ms: out }) + "\n");
