#!/usr/bin/env node
// Compiles contracts/src/**/*.sol offline with the pinned npm `solc` and writes one artifact per
// contract to contracts/build/ (or to the folder given with --out, which the staleness test uses).
// Imports starting with "@openzeppelin/" come from contracts/node_modules, nothing is fetched.
"use strict";

const crypto = require("crypto");
const fs = require("fs");
const path = require("path");
const solc = require("solc");

const ROOT = __dirname;
const SRC = path.join(ROOT, "src");
const NODE_MODULES = path.join(ROOT, "node_modules");

// Keep in sync with nothing else: the Python side reads these back from the artifacts.
const SETTINGS = {
  evmVersion: "cancun",
  optimizer: { enabled: true, runs: 200 },
  outputSelection: {
    "*": { "*": ["abi", "evm.bytecode.object", "evm.deployedBytecode.object"] },
  },
};

function sha256(text) {
  return crypto.createHash("sha256").update(text, "utf8").digest("hex");
}

function listSources(dir) {
  const found = [];
  for (const entry of fs.readdirSync(dir, { withFileTypes: true })) {
    const full = path.join(dir, entry.name);
    if (entry.isDirectory()) found.push(...listSources(full));
    else if (entry.name.endsWith(".sol")) found.push(full);
  }
  return found.sort();
}

// Source unit names are POSIX paths relative to contracts/ ("src/GPUFlexEscrow.sol"), so the
// embedded metadata, and hence the bytecode, is the same on every machine.
function unitName(file) {
  return path.relative(ROOT, file).split(path.sep).join("/");
}

function findImports(importPath) {
  if (!importPath.startsWith("@openzeppelin/")) return { error: `import not allowed: ${importPath}` };
  const file = path.join(NODE_MODULES, importPath);
  if (!file.startsWith(NODE_MODULES + path.sep)) return { error: `bad import path: ${importPath}` };
  try {
    return { contents: fs.readFileSync(file, "utf8") };
  } catch (err) {
    return { error: `not found: ${importPath} (run npm ci --prefix contracts)` };
  }
}

function compile() {
  const sources = {};
  for (const file of listSources(SRC)) sources[unitName(file)] = { content: fs.readFileSync(file, "utf8") };
  const input = { language: "Solidity", sources, settings: SETTINGS };
  const output = JSON.parse(solc.compile(JSON.stringify(input), { import: findImports }));
  const errors = (output.errors || []).filter((e) => e.severity === "error");
  for (const e of output.errors || []) process.stderr.write(e.formattedMessage + "\n");
  if (errors.length) throw new Error(`solc reported ${errors.length} error(s)`);

  // Every source solc actually read, OpenZeppelin included, hashed one by one and together
  // with the compiler version and settings: any change to any of them changes sourcesSha256.
  const allSources = {};
  for (const name of Object.keys(output.sources).sort()) {
    const content = sources[name] ? sources[name].content : findImports(name).contents;
    allSources[name] = sha256(content);
  }
  const compiler = { version: solc.version(), settings: SETTINGS };
  const sourcesSha256 = sha256(JSON.stringify({ compiler, sources: allSources }));

  const artifacts = [];
  for (const unit of Object.keys(output.contracts).sort()) {
    if (!unit.startsWith("src/")) continue;
    for (const name of Object.keys(output.contracts[unit]).sort()) {
      const c = output.contracts[unit][name];
      artifacts.push({
        contractName: name,
        sourceName: unit,
        testOnly: unit.startsWith("src/test/"),
        abi: c.abi,
        bytecode: "0x" + c.evm.bytecode.object,
        deployedBytecode: "0x" + c.evm.deployedBytecode.object,
        compiler,
        sources: allSources,
        sourcesSha256,
      });
    }
  }
  return artifacts;
}

function main() {
  const args = process.argv.slice(2);
  const outIndex = args.indexOf("--out");
  const out = outIndex >= 0 ? path.resolve(args[outIndex + 1]) : path.join(ROOT, "build");
  fs.mkdirSync(out, { recursive: true });
  const artifacts = compile();
  if (out === path.join(ROOT, "build")) {
    // Drop artifacts of contracts that no longer exist, so build/ mirrors src/ exactly.
    const keep = new Set(artifacts.map((a) => `${a.contractName}.json`));
    for (const f of fs.readdirSync(out)) if (f.endsWith(".json") && !keep.has(f)) fs.unlinkSync(path.join(out, f));
  }
  for (const a of artifacts) {
    fs.writeFileSync(path.join(out, `${a.contractName}.json`), JSON.stringify(a, null, 2) + "\n");
  }
  process.stdout.write(`compiled ${artifacts.length} contracts with solc ${solc.version()} into ${out}\n`);
}

main();
