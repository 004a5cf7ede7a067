// The local JSON-RPC node the chain tests start (`hardhat node`, tests/chain_node.py). Nothing
// here compiles (contracts/compile.js does, with solc-js), so Hardhat never downloads a compiler.
module.exports = {
  networks: {
    hardhat: { hardfork: "cancun", chainId: 31337 },
  },
  paths: { sources: "./hardhat-no-sources", cache: "./hardhat-cache" },
};
