"""/api/v1/: agent, providers, buyers, market, operators, keys, schema and docs."""

from django.urls import path
from drf_spectacular.views import SpectacularSwaggerView

from marketplace.api.schema_view import CachedSchemaView
from marketplace.api.views import agent, jobs, keys, ledger, market, nodes, proofs, secagg, uploads

urlpatterns = [
    # agent (docs/agent-api.md)
    path("nodes/", nodes.NodeListView.as_view(), name="nodes"),
    path("agent/heartbeat", agent.HeartbeatView.as_view(), name="agent-heartbeat"),
    path("agent/claim", agent.ClaimView.as_view(), name="agent-claim"),
    path("agent/tasks/<str:task_id>/model", agent.TaskModelView.as_view(), name="agent-model"),
    path("agent/tasks/<str:task_id>/shard", agent.TaskShardView.as_view(), name="agent-shard"),
    path(
        "agent/tasks/<str:task_id>/program", agent.TaskProgramView.as_view(), name="agent-program"
    ),
    path("agent/tasks/<str:task_id>/update", agent.TaskUpdateView.as_view(), name="agent-update"),
    path("agent/tasks/<str:task_id>/fail", agent.TaskFailView.as_view(), name="agent-fail"),
    # secure aggregation (marketplace.rounds.secagg)
    path("agent/tasks/<str:task_id>/secagg", secagg.SecAggView.as_view(), name="agent-secagg"),
    path(
        "agent/tasks/<str:task_id>/secagg/shares",
        secagg.SecAggSharesView.as_view(),
        name="agent-secagg-shares",
    ),
    path(
        "agent/tasks/<str:task_id>/secagg/unmask",
        secagg.SecAggUnmaskView.as_view(),
        name="agent-secagg-unmask",
    ),
    path(
        "agent/tasks/<str:task_id>/handoff", agent.TaskHandOffView.as_view(), name="agent-handoff"
    ),
    path("agent/zone/rounds/<int:round_id>", agent.ZoneRoundView.as_view(), name="zone-round"),
    path(
        "agent/zone/rounds/<int:round_id>/model",
        agent.ZoneModelView.as_view(),
        name="zone-model",
    ),
    path("agent/zone/partial", agent.ZonePartialView.as_view(), name="zone-partial"),
    path("agent/proofs", proofs.ProofRequestsView.as_view(), name="agent-proofs"),
    path(
        "agent/proofs/<int:check_id>/checkpoints/<int:step>",
        proofs.ProofRevealView.as_view(),
        name="agent-proof-reveal",
    ),
    path("agent/me", agent.MeView.as_view(), name="agent-me"),
    path("agent/datasets", agent.LocalDatasetsView.as_view(), name="agent-datasets"),
    path("agent/probe", agent.ProbeView.as_view(), name="agent-probe"),
    # providers
    path("nodes/<int:pk>/", nodes.NodeDetailView.as_view(), name="node-detail"),
    path("nodes/<int:pk>/key", nodes.NodeKeyView.as_view(), name="node-key"),
    # buyers
    path("jobs/", jobs.JobListView.as_view(), name="jobs"),
    # chunked dataset uploads (docs/uploads.md)
    path("uploads/", uploads.UploadListView.as_view(), name="uploads"),
    path("uploads/<uuid:pk>/", uploads.UploadDetailView.as_view(), name="upload-detail"),
    path("uploads/<uuid:pk>/finish", uploads.UploadFinishView.as_view(), name="upload-finish"),
    path("jobs/<uuid:pk>/", jobs.JobDetailView.as_view(), name="job-detail"),
    path("jobs/<uuid:pk>/rounds/", jobs.JobRoundsView.as_view(), name="job-rounds"),
    path("jobs/<uuid:pk>/model", jobs.JobModelView.as_view(), name="job-model"),
    path("jobs/<uuid:pk>/predictions", jobs.JobPredictionsView.as_view(), name="job-predictions"),
    path("jobs/<uuid:pk>/tracking", jobs.JobTrackingView.as_view(), name="job-tracking"),
    path("jobs/<uuid:pk>/provenance", jobs.JobProvenanceView.as_view(), name="job-provenance"),
    path("jobs/<uuid:pk>/events", jobs.JobEventsView.as_view(), name="job-events"),
    path("jobs/<uuid:pk>/anchors", jobs.JobAnchorsView.as_view(), name="job-anchors"),
    *[
        path(
            f"jobs/<uuid:pk>/{action}",
            jobs.JobActionView.as_view(action_name=action),
            name=f"job-{action}",
        )
        for action in ("pause", "resume", "cancel")
    ],
    # money (docs/money.md)
    path("ledger/balance", ledger.BalanceView.as_view(), name="ledger-balance"),
    path("ledger/statement", ledger.StatementView.as_view(), name="ledger-statement"),
    path("ledger/earnings", ledger.EarningsView.as_view(), name="ledger-earnings"),
    path("ledger/wallet", ledger.WalletView.as_view(), name="ledger-wallet"),
    path("payouts/", ledger.PayoutListView.as_view(), name="payouts"),
    path("payouts/<int:pk>/proof", ledger.PayoutProofView.as_view(), name="payout-proof"),
    path("ledger/withdrawals", ledger.WithdrawalListView.as_view(), name="ledger-withdrawals"),
    path(
        "nodes/<int:pk>/contributions",
        ledger.NodeContributionsView.as_view(),
        name="node-contributions",
    ),
    path("operator/credits", ledger.GrantView.as_view(), name="operator-credits"),
    path("operator/fees", ledger.FeeWithdrawalView.as_view(), name="operator-fees"),
    path("operator/reconcile", ledger.ReconcileView.as_view(), name="operator-reconcile"),
    path("operator/payouts/<int:pk>/paid", ledger.PayoutPaidView.as_view(), name="payout-paid"),
    # market and operators
    path("market/capacity", market.CapacityView.as_view(), name="market-capacity"),
    path("operator/nodes/", market.OperatorNodesView.as_view(), name="operator-nodes"),
    path(
        "operator/enrollment-tokens",
        nodes.EnrollmentTokenView.as_view(),
        name="operator-enrollment-tokens",
    ),
    path("operator/summary", market.OperatorSummaryView.as_view(), name="operator-summary"),
    # keys
    path("keys/", keys.KeyListView.as_view(), name="keys"),
    path("keys/<int:pk>", keys.KeyDetailView.as_view(), name="key-detail"),
    # schema
    path("schema/", CachedSchemaView.as_view(), name="schema"),
    path("docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="docs"),
]
