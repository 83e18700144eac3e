// The worker under Paperclip's worker manager, measured against the simulator:
// requests and wall time of one lease lifecycle, the same lifecycle through
// `host-harness lifecycle`, and what the bridge adds per call.
//
// cargo build --release -p paperclip-worker -p host-harness --bins --examples
// PROFILE=release npm run bench
import { execFileSync } from "node:child_process";
import { mkdtempSync, mkdirSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { buildPackage, programs, startHandle, startSimulator } from "./harness.mjs";

const ROUNDS = Number(process.env.ROUNDS ?? 5);
const CALLS = Number(process.env.CALLS ?? 2000);

const sim = await startSimulator();
const pkg = await buildPackage();
const scratch = mkdtempSync(path.join(tmpdir(), "paperclip-bench-"));
const handle = await startHandle(pkg.dir, pkg.manifest);
const config = { apiKey: sim.apiKey, apiUrl: sim.url, shape: "s-1vcpu-1gb", reuseLease: true, requestsPerMinute: 100000 };
const env = { driverKey: "createos", companyId: "acme", environmentId: "bench", config };
const allRequests = () => sim.count("* /v1/**");
const median = (values) => [...values].sort((a, b) => a - b)[Math.floor(values.length / 2)];
const percentile = (values, p) => [...values].sort((a, b) => a - b)[Math.min(values.length - 1, Math.floor(values.length * p))];
const ms = (value) => value.toFixed(1);

// The steps of `host-harness lifecycle`, as Paperclip's calls.
async function lifecycle(round) {
  const local = path.join(scratch, `round-${round}`);
  mkdirSync(path.join(local, "in"), { recursive: true });
  writeFileSync(path.join(local, "in", "input.txt"), "lifecycle input\n");
  const calls = [];
  const call = async (method, params) => {
    const before = await allRequests();
    const result = await handle.call(method, params);
    calls.push(`${method.replace("environment", "")} ${(await allRequests()) - before}`);
    return result;
  };
  await call("environmentValidateConfig", { driverKey: "createos", config });
  await call("environmentProbe", env);
  const lease = await call("environmentAcquireLease", { ...env, runId: `bench-${round}` });
  const onLease = (l) => ({ ...env, lease: { providerLeaseId: l.providerLeaseId, metadata: l.metadata } });
  const byId = (l) => ({ ...env, providerLeaseId: l.providerLeaseId, leaseMetadata: l.metadata });
  await call("environmentRealizeWorkspace", { ...onLease(lease), workspace: {} });
  await call("environmentSyncIn", { ...onLease(lease), operations: [{ operationId: "in", files: [{ sourcePath: path.join(local, "in"), targetPath: "/paperclip-workspace/in", kind: "directory" }] }] });
  await call("environmentExecute", { ...onLease(lease), command: "/bin/sh", args: ["-c", "cp in/input.txt out.txt"], cwd: "/paperclip-workspace" });
  await call("environmentSyncOut", { ...onLease(lease), operations: [{ operationId: "out", files: [{ sourcePath: "/paperclip-workspace/out.txt", targetPath: path.join(local, "out.txt"), kind: "file" }] }] });
  await call("environmentReleaseLease", byId(lease));
  const resumed = await call("environmentResumeLease", byId(lease));
  await call("environmentExecute", { ...onLease(resumed), command: "/bin/true" });
  await call("environmentDestroyLease", byId(resumed));
  return calls;
}

const paperclip = [];
let calls = 0;
let requests = 0;
for (let round = 0; round < ROUNDS; round++) {
  const before = await allRequests();
  const start = performance.now();
  calls = await lifecycle(round);
  paperclip.push(performance.now() - start);
  requests = (await allRequests()) - before;
}

const harnessConfig = path.join(scratch, "harness.json");
writeFileSync(harnessConfig, JSON.stringify({ driverKey: "createos", companyId: "acme", environmentId: "bench-harness", config }));
const harness = [];
let harnessRequests = 0;
for (let round = 0; round < ROUNDS; round++) {
  const before = await allRequests();
  const start = performance.now();
  execFileSync(programs.harness, ["lifecycle", "--plugin", programs.provider, "--config", harnessConfig, "--ledger", path.join(scratch, "harness.sqlite3"), "--json"], { stdio: "ignore" });
  harness.push(performance.now() - start);
  harnessRequests = (await allRequests()) - before;
}

// The bridge alone: `health` costs the provider tens of nanoseconds, so its
// round trip through the manager is what the bridge adds to any call.
const health = [];
for (let i = 0; i < CALLS; i++) {
  const start = performance.now();
  await handle.call("health", {});
  health.push(performance.now() - start);
}
// A lease call with no remote request: the bridge plus the host's ledger lookup.
const lease = await handle.call("environmentAcquireLease", { ...env, runId: "bench-realize" });
const realize = [];
for (let i = 0; i < CALLS / 4; i++) {
  const start = performance.now();
  await handle.call("environmentRealizeWorkspace", { ...env, lease: { providerLeaseId: lease.providerLeaseId, metadata: lease.metadata }, workspace: {} });
  realize.push(performance.now() - start);
}
await handle.call("environmentDestroyLease", { ...env, providerLeaseId: lease.providerLeaseId, leaseMetadata: lease.metadata });

console.log(`lifecycle through Paperclip's worker manager: ${calls.length} calls (API requests each: ${calls.join(", ")}), ${requests} API requests, median ${ms(median(paperclip))} ms (${paperclip.map(ms).join(", ")})`);
console.log(`the same lifecycle through host-harness lifecycle (a process each, loading included): ${harnessRequests} API requests, median ${ms(median(harness))} ms (${harness.map(ms).join(", ")})`);
console.log(`health round trip through the manager, ${CALLS} calls: p50 ${(median(health) * 1000).toFixed(0)} µs, p99 ${(percentile(health, 0.99) * 1000).toFixed(0)} µs`);
console.log(`environmentRealizeWorkspace (no request; the ledger's lookup and adoption), ${realize.length} calls: p50 ${(median(realize) * 1000).toFixed(0)} µs, p99 ${(percentile(realize, 0.99) * 1000).toFixed(0)} µs`);

await handle.stop();
await sim.stop();
rmSync(pkg.dir, { recursive: true, force: true });
rmSync(scratch, { recursive: true, force: true });
