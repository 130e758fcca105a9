#!/usr/bin/env node
// A Node.js client for sandboxd, built from the .proto alone: no generated code, no Python.
// It shows that any gRPC stack can call the daemon; tests/integration/test_node_client.py
// runs it against a real daemon.
//
//   npm ci --ignore-scripts                       # in this folder (scripts/setup.sh does it)
//   node sandboxd.js info
//   echo '{"math": {"completion": "so \\boxed{4}", "ground_truth": "4"}}' | node sandboxd.js run
//   echo '[{"math": ...}, {"code": ...}]' | node sandboxd.js batch    # one result per line, as they finish
//
// Options: --address TARGET (default $SANDBOXD_ADDRESS, else unix:///run/sandboxd/sandboxd.sock;
// "host:port" for TCP), --deadline SECONDS (per call, default 120), --retries N (default 5).
// Jobs and results are the proto's messages as JSON with the .proto's field names
// (snake_case), enums by name ("STATUS_OK"), bytes as base64, 64-bit integers as strings.
// Exit status: 0 answered, 1 the RPC failed (gRPC status on stderr), 2 bad usage or input.
"use strict";

const fs = require("fs");
const path = require("path");
const grpc = require("@grpc/grpc-js");
const protoLoader = require("@grpc/proto-loader");

const PROTO_ROOT = path.resolve(__dirname, "..", "..", "protos");
const DEFAULT_ADDRESS = "unix:///run/sandboxd/sandboxd.sock";
// Only these mean "try again": the daemon is away (restarting) or full (it sends a hint).
const RETRYABLE = new Set([grpc.status.UNAVAILABLE, grpc.status.RESOURCE_EXHAUSTED]);

function usage(message) {
  if (message) console.error(`sandboxd.js: ${message}`);
  console.error("usage: node sandboxd.js [--address TARGET] [--deadline SECONDS] [--retries N] info|run|batch");
  process.exit(2);
}

function parseArgs(argv) {
  const options = { address: process.env.SANDBOXD_ADDRESS || DEFAULT_ADDRESS, deadline: 120, retries: 5 };
  const rest = [];
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i];
    const value = () => {
      if (i + 1 >= argv.length) usage(`${arg} needs a value`);
      return argv[++i];
    };
    if (arg === "--address") options.address = value();
    else if (arg === "--deadline") options.deadline = Number(value());
    else if (arg === "--retries") options.retries = Number(value());
    else if (arg === "-h" || arg === "--help") usage();
    else rest.push(arg);
  }
  if (!(options.deadline > 0)) usage("--deadline must be a positive number of seconds");
  if (!(Number.isInteger(options.retries) && options.retries >= 0)) usage("--retries must be an integer >= 0");
  if (rest.length !== 1 || !["info", "run", "batch"].includes(rest[0])) usage();
  options.command = rest[0];
  return options;
}

function loadApi() {
  const definition = protoLoader.loadSync(path.join("sandboxd", "v1", "sandboxd.proto"), {
    includeDirs: [PROTO_ROOT],
    keepCase: true, // the .proto's names, as every other client spells them
    longs: String,
    enums: String,
    bytes: String, // base64
    defaults: true,
    oneofs: true,
  });
  return grpc.loadPackageDefinition(definition).sandboxd.v1;
}

function readStdinJson() {
  const text = fs.readFileSync(0, "utf8");
  try {
    return JSON.parse(text);
  } catch (err) {
    usage(`standard input is not JSON: ${err.message}`);
  }
}

function deadlineAfter(seconds) {
  return new Date(Date.now() + seconds * 1000);
}

function sleep(ms) {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

// gRPC's own message size limit says RESOURCE_EXHAUSTED too; the same request is as large next time.
function tooLarge(err) {
  return /message larger than max/i.test(err.details || err.message || "");
}

// A unary call with a deadline on every attempt, retried with backoff on UNAVAILABLE and
// RESOURCE_EXHAUSTED only (honouring the daemon's retry-after-seconds hint).
async function unary(client, method, request, options) {
  for (let attempt = 0; ; attempt++) {
    try {
      return await new Promise((resolve, reject) => {
        client[method](request, { deadline: deadlineAfter(options.deadline) }, (err, reply) =>
          err ? reject(err) : resolve(reply),
        );
      });
    } catch (err) {
      if (!RETRYABLE.has(err.code) || tooLarge(err) || attempt >= options.retries) throw err;
      const hint = Number((err.metadata && err.metadata.get("retry-after-seconds")[0]) || 0);
      const backoff = Math.min(5, 0.25 * 2 ** attempt) * (0.5 + Math.random() / 2);
      await sleep(1000 * Math.max(backoff, hint));
    }
  }
}

// RunBatch: results stream back as they finish, each carrying its job's index.
function batch(client, jobs, options, onResult) {
  return new Promise((resolve, reject) => {
    const call = client.RunBatch({ jobs }, { deadline: deadlineAfter(options.deadline) });
    call.on("data", onResult);
    call.on("error", reject);
    call.on("end", resolve);
  });
}

async function main() {
  const options = parseArgs(process.argv.slice(2));
  const api = loadApi();
  const credentials = grpc.credentials.createInsecure();
  const print = (message) => process.stdout.write(JSON.stringify(message) + "\n");

  if (options.command === "info") {
    const daemon = new api.Daemon(options.address, credentials);
    print(await unary(daemon, "GetInfo", {}, options));
    daemon.close();
    return;
  }
  const jobs = new api.Jobs(options.address, credentials);
  const input = readStdinJson();
  if (options.command === "run") {
    if (input === null || typeof input !== "object" || Array.isArray(input)) usage("run takes one Job object");
    print(await unary(jobs, "Run", input, options));
  } else {
    if (!Array.isArray(input) || input.length === 0) usage("batch takes a non-empty JSON array of Job objects");
    // The index is how results, arriving in any order, find their job.
    const stamped = input.map((job, index) => ({ ...job, index }));
    let answered = 0;
    await batch(jobs, stamped, options, (result) => {
      answered++;
      print(result);
    });
    if (answered !== stamped.length) {
      throw Object.assign(new Error(`${answered} results for ${stamped.length} jobs`), { code: grpc.status.DATA_LOSS });
    }
  }
  jobs.close();
}

main().catch((err) => {
  const code = err.code !== undefined ? (grpc.status[err.code] || err.code) : "ERROR";
  console.error(`sandboxd.js: ${code}: ${err.details || err.message}`);
  process.exit(1);
});
