// The local JSON-RPC node the chain tests start (`hardhat node`, see tests/chain_node.py).
// Only the node is used: contracts/compile.js builds the contracts with solc-js, so Hardhat
// never compiles, and never downloads a compiler.
module.exports = {
  networks: {
    hardhat: { hardfork: "cancun", chainId: 31337 },
  },
};
