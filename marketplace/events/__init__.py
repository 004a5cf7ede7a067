"""Live pushes: "this changed" doorbells rung after a commit, and the Server-Sent Events
streams that pages and the SDK hold open to hear them (docs/architecture.md, "Live pushes")."""
