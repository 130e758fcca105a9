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
// A daemon's TCP door (docs/deploy.md): --token TOKEN (default $SANDBOXD_TOKEN), sent on every call as
// "authorization: Bearer TOKEN"; TLS with --tls-ca PEM (default $SANDBOXD_TLS_CA, else the system's CAs),
// and for mutual TLS --tls-cert PEM --tls-key PEM ($SANDBOXD_TLS_CERT, $SANDBOXD_TLS_KEY); --tls turns TLS
// on with none of them, --tls-server-name NAME checks the daemon's certificate for NAME. TLS is on when
// --tls or any of those files is given; a unix: target stays plaintext whatever they say, as in the
// Python client.
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
// gRPC backs off from 1 s up to 120 s between connection attempts: a daemon back after a restart went
// unnoticed for tens of seconds. The Python client's settings (attempts 0.25-1 s apart; measured there,
// docs/deploy.md), which matter when a retry below waits for a daemon coming back.
const CHANNEL_OPTIONS = { "grpc.initial_reconnect_backoff_ms": 250, "grpc.max_reconnect_backoff_ms": 1000 };

function usage(message) {
  if (message) console.error(`sandboxd.js: ${message}`);
  console.error(
    "usage: node sandboxd.js [--address TARGET] [--deadline SECONDS] [--retries N] [--token TOKEN]\n" +
      "       [--tls] [--tls-ca PEM] [--tls-cert PEM --tls-key PEM] [--tls-server-name NAME] info|run|batch",
  );
  process.exit(2);
}

function parseArgs(argv) {
  const env = process.env;
  const options = {
    address: env.SANDBOXD_ADDRESS || DEFAULT_ADDRESS,
    deadline: 120,
    retries: 5,
    token: env.SANDBOXD_TOKEN || "",
    tls: false,
    tlsCa: env.SANDBOXD_TLS_CA || "",
    tlsCert: env.SANDBOXD_TLS_CERT || "",
    tlsKey: env.SANDBOXD_TLS_KEY || "",
    tlsServerName: "",
  };
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
    else if (arg === "--token") options.token = value();
    else if (arg === "--tls") options.tls = true;
    else if (arg === "--tls-ca") options.tlsCa = value();
    else if (arg === "--tls-cert") options.tlsCert = value();
    else if (arg === "--tls-key") options.tlsKey = value();
    else if (arg === "--tls-server-name") options.tlsServerName = value();
    else if (arg === "-h" || arg === "--help") usage();
    else rest.push(arg);
  }
  if (!(options.deadline > 0)) usage("--deadline must be a positive number of seconds");
  if (!(Number.isInteger(options.retries) && options.retries >= 0)) usage("--retries must be an integer >= 0");
  // What gRPC would refuse to send as a header, refused here with a clear word.
  if (options.token && !/^[\x21-\x7e]+$/.test(options.token)) usage("the token must be printable ASCII without spaces");
  if (Boolean(options.tlsCert) !== Boolean(options.tlsKey)) {
    usage("--tls-cert and --tls-key (a client certificate for mutual TLS) go together");
  }
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

function readPem(kind, file) {
  try {
    return fs.readFileSync(file);
  } catch (err) {
    usage(`cannot read ${kind} ${file}: ${err.message}`);
  }
}

// Channel credentials for the target: TLS when asked for (a unix: socket never: its file mode is its door).
function channelCredentials(options) {
  const wanted = options.tls || options.tlsCa || options.tlsCert || options.tlsKey;
  if (!wanted || options.address.startsWith("unix:")) return grpc.credentials.createInsecure();
  return grpc.credentials.createSsl(
    options.tlsCa ? readPem("--tls-ca", options.tlsCa) : null,
    options.tlsKey ? readPem("--tls-key", options.tlsKey) : null,
    options.tlsCert ? readPem("--tls-cert", options.tlsCert) : null,
  );
}

function channelOptions(options) {
  if (!options.tlsServerName) return CHANNEL_OPTIONS;
  return {
    ...CHANNEL_OPTIONS,
    "grpc.ssl_target_name_override": options.tlsServerName,
    "grpc.default_authority": options.tlsServerName,
  };
}

// Every call carries the token; the daemon's Unix socket ignores it.
function callMetadata(options) {
  const metadata = new grpc.Metadata();
  if (options.token) metadata.set("authorization", `Bearer ${options.token}`);
  return metadata;
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
        const callOptions = { deadline: deadlineAfter(options.deadline) };
        client[method](request, callMetadata(options), callOptions, (err, reply) => (err ? reject(err) : resolve(reply)));
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
    const call = client.RunBatch({ jobs }, callMetadata(options), { deadline: deadlineAfter(options.deadline) });
    call.on("data", onResult);
    call.on("error", reject);
    call.on("end", resolve);
  });
}

async function main() {
  const options = parseArgs(process.argv.slice(2));
  const api = loadApi();
  const credentials = channelCredentials(options);
  const channel = channelOptions(options);
  const print = (message) => process.stdout.write(JSON.stringify(message) + "\n");

  if (options.command === "info") {
    const daemon = new api.Daemon(options.address, credentials, channel);
    print(await unary(daemon, "GetInfo", {}, options));
    daemon.close();
    return;
  }
  const jobs = new api.Jobs(options.address, credentials, channel);
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
