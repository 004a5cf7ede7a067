"""Money: balances, statements, earnings, payouts, wallets; operators grant credit, mark
payouts paid and reconcile. Every amount is a decimal string."""

# ruff: noqa: RUF012 - Django/DRF declare Meta options and view settings as class attributes

from __future__ import annotations

from django.db import transaction
from django.shortcuts import get_object_or_404
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema
from rest_framework import generics, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from marketplace.accounts.models import User
from marketplace.api.permissions import IsOperator, IsProvider, IsUser
from marketplace.api.schema import errors
from marketplace.api.serializers.ledger import (
    EntrySerializer,
    GrantSerializer,
    PayoutRequestSerializer,
    PayoutSerializer,
    ReferenceSerializer,
    WalletSerializer,
    WithdrawalRequestSerializer,
)
from marketplace.api.serializers.queries import EarningsQuerySerializer
from marketplace.jobs.errors import Conflict, NotFound
from marketplace.ledger import accounts, holds, selectors, services
from marketplace.ledger.models import Payout, PayoutKind, SettlementRecord, WalletAddress
from marketplace.ledger.posting import balance
from marketplace.ledger.reconcile import reconcile
from marketplace.ledger.registry import request_registration
from marketplace.ledger.tasks import enqueue_registration
from marketplace.nodes.selectors import nodes_of


def _idempotency_key(request: Request, body: dict) -> str:
    return body.get("idempotency_key") or request.headers.get("Idempotency-Key", "")


class BalanceView(APIView):
    permission_classes = [IsUser]

    @extend_schema(responses=OpenApiTypes.OBJECT)
    def get(self, request: Request) -> Response:
        return Response(selectors.balances(request.user).to_dict())


class StatementView(generics.ListAPIView):
    permission_classes = [IsUser]
    serializer_class = EntrySerializer

    def get_queryset(self):
        return selectors.statement(self.request.user, limit=1000)


class EarningsView(APIView):
    permission_classes = [IsProvider]

    @extend_schema(parameters=[EarningsQuerySerializer], responses=OpenApiTypes.OBJECT)
    def get(self, request: Request) -> Response:
        query = EarningsQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        days = query.validated_data["days"]
        rows = lambda rows: [r | {"amount": str(r["amount"])} for r in rows]  # noqa: E731
        money = selectors.balances(request.user)
        return Response(
            {
                "balance": str(money.earnings),
                # unverified work's earnings wait out GPUFLEX_PAYOUT_HOLD_S (docs/money.md)
                "held": str(money.earnings_held),
                "available": str(money.earnings_available),
                "releases": [  # per UTC day, soonest first
                    {"date": day, "amount": str(amount)}
                    for day, amount in holds.releases_by_day(request.user)
                ],
                "by_node": rows(selectors.earnings_by_node(request.user)),
                "by_job": rows(selectors.earnings_by_job(request.user)),
                "daily": [
                    {"date": d.isoformat(), "amount": str(a)}
                    for d, a in selectors.earnings_series(request.user, days)
                ],
            }
        )


class PayoutListView(generics.ListAPIView):
    permission_classes = [IsProvider]
    serializer_class = PayoutSerializer

    def get_queryset(self):
        return selectors.payouts_for(self.request.user).select_related("batch")

    @extend_schema(
        request=PayoutRequestSerializer,
        responses={201: PayoutSerializer, 200: PayoutSerializer, **errors(402, 409)},
    )
    def post(self, request: Request) -> Response:
        body = PayoutRequestSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        key = _idempotency_key(request, body.validated_data)
        existed = Payout.objects.filter(user=request.user, request_key=key).exists()
        payout = services.request_payout(
            user=request.user,
            amount=body.validated_data["amount"],
            wallet_address=body.validated_data["wallet_address"],
            idempotency_key=key,
        )
        code = status.HTTP_200_OK if existed else status.HTTP_201_CREATED
        return Response(PayoutSerializer(payout).data, status=code)


class PayoutProofView(APIView):
    """The Merkle proof the payee submits to the escrow contract's claim(): a provider's
    payout, a buyer's withdrawal, the operator's fees (each only to its own requester)."""

    permission_classes = [IsUser]

    @extend_schema(responses={200: OpenApiTypes.OBJECT, **errors(409)})
    def get(self, request: Request, pk: int) -> Response:
        payout = get_object_or_404(selectors.payouts_for(request.user), pk=pk)
        if payout.batch is None:
            raise Conflict(f"Payout {pk} is {payout.status}; it is not in an on-chain batch.")
        from marketplace.ledger.chain import claim_proof

        return Response(claim_proof(payout))


class WalletView(APIView):
    permission_classes = [IsUser]

    @extend_schema(responses=OpenApiTypes.OBJECT)
    def get(self, request: Request) -> Response:
        wallet = WalletAddress.objects.filter(user=request.user).first()
        body: dict = {"address": wallet.address if wallet else None}
        from django.conf import settings

        if settings.CHAIN["URL"]:
            from marketplace.ledger.chain import funding_id

            body["funding_id"] = funding_id(request.user)
        return Response(body)

    @extend_schema(request=WalletSerializer, responses={200: OpenApiTypes.OBJECT, **errors(409)})
    def put(self, request: Request) -> Response:
        body = WalletSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        address = body.validated_data["address"]
        with transaction.atomic():
            taken = WalletAddress.objects.filter(address__iexact=address).exclude(user=request.user)
            if taken.exists():
                raise Conflict(f"{address} is already registered to another account.")
            WalletAddress.objects.update_or_create(user=request.user, defaults={"address": address})
            # a provider's wallet goes into the NodeRegistry with its nodes' capability hash
            enqueue_registration(request_registration(request.user, address))
        return self.get(request)


class GrantView(APIView):
    permission_classes = [IsOperator]

    @extend_schema(
        request=GrantSerializer, responses={201: OpenApiTypes.OBJECT, **errors(404, 409)}
    )
    def post(self, request: Request) -> Response:
        body = GrantSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        user = User.objects.filter(username=data["username"]).first()
        if user is None:
            raise NotFound(f"No user is called {data['username']!r}.")
        key = _idempotency_key(request, data)
        tx = services.grant_credit(
            user=user,
            amount=data["amount"],
            memo=data["memo"],
            operator=request.user,
            key=f"grant:{request.user.pk}:{key}" if key else "",
        )
        return Response(
            {"transaction": tx.key, "balance": selectors.balances(user).to_dict()},
            status=status.HTTP_201_CREATED,
        )


class ReconcileView(APIView):
    permission_classes = [IsOperator]

    @extend_schema(responses=OpenApiTypes.OBJECT)
    def get(self, request: Request) -> Response:
        return Response(reconcile().to_dict())


class PayoutPaidView(APIView):
    permission_classes = [IsOperator]

    @extend_schema(request=ReferenceSerializer, responses={200: PayoutSerializer, **errors(409)})
    def post(self, request: Request, pk: int) -> Response:
        body = ReferenceSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        payout = get_object_or_404(Payout, pk=pk)
        payout = services.mark_payout_paid(
            payout, reference=body.validated_data["reference"], operator=request.user
        )
        return Response(PayoutSerializer(payout).data)


def _chain_required() -> None:
    from django.conf import settings

    if not settings.CHAIN["URL"]:
        raise Conflict("The chain is disabled on this marketplace (GPUFLEX_CHAIN_URL).")


class WithdrawalListView(APIView):
    """A buyer's withdrawals of unspent on-chain deposits: listed, and requested. Each goes
    into the next settlement batch; the buyer then pulls it from the escrow with the proof
    from payouts/<id>/proof (claim, or claimTo for a wallet that cannot take the coin)."""

    permission_classes = [IsUser]

    @extend_schema(responses={200: OpenApiTypes.OBJECT, **errors(409)})
    def get(self, request: Request) -> Response:
        _chain_required()
        from marketplace.ledger.chain import withdrawable

        rows = selectors.payouts_for(request.user).filter(kind=PayoutKind.WITHDRAWAL)
        return Response(
            {
                "withdrawable": str(withdrawable(request.user)),
                "withdrawals": PayoutSerializer(rows.select_related("batch"), many=True).data,
            }
        )

    @extend_schema(
        request=WithdrawalRequestSerializer,
        responses={201: PayoutSerializer, 200: PayoutSerializer, **errors(402, 409)},
    )
    def post(self, request: Request) -> Response:
        _chain_required()
        body = WithdrawalRequestSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        key = _idempotency_key(request, body.validated_data)
        existed = Payout.objects.filter(user=request.user, request_key=key).exists()
        payout = services.request_withdrawal(
            user=request.user, amount=body.validated_data["amount"], idempotency_key=key
        )
        code = status.HTTP_200_OK if existed else status.HTTP_201_CREATED
        return Response(PayoutSerializer(payout).data, status=code)


class FeeWithdrawalView(APIView):
    """The operator withdraws platform fees on chain, pulled like every other payout."""

    permission_classes = [IsOperator]

    @extend_schema(responses=OpenApiTypes.OBJECT)
    def get(self, request: Request) -> Response:
        rows = Payout.objects.filter(kind=PayoutKind.FEES).order_by("-created_at")
        return Response(
            {
                "fees": str(balance(accounts.platform_fees())),
                "withdrawals": PayoutSerializer(rows.select_related("batch"), many=True).data,
            }
        )

    @extend_schema(
        request=PayoutRequestSerializer,
        responses={201: PayoutSerializer, 200: PayoutSerializer, **errors(402, 409)},
    )
    def post(self, request: Request) -> Response:
        _chain_required()
        body = PayoutRequestSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        key = _idempotency_key(request, body.validated_data)
        existed = Payout.objects.filter(user=request.user, request_key=key).exists()
        payout = services.request_fee_withdrawal(
            operator=request.user,
            amount=body.validated_data["amount"],
            wallet_address=body.validated_data["wallet_address"],
            idempotency_key=key,
        )
        code = status.HTTP_200_OK if existed else status.HTTP_201_CREATED
        return Response(PayoutSerializer(payout).data, status=code)


class NodeContributionsView(APIView):
    """What each settlement batch credited one of the provider's nodes with, with the Merkle
    proof of its leaf in the batch's anchored contribution root (ProvenanceRegistry
    verifyContribution checks it on chain; so does `gpuflex contributions --check`)."""

    permission_classes = [IsProvider]

    @extend_schema(responses={200: OpenApiTypes.OBJECT, **errors(404, 409)})
    def get(self, request: Request, pk: int) -> Response:
        _chain_required()
        from marketplace.ledger.chain import contribution_proof

        node = get_object_or_404(nodes_of(request.user), pk=pk)
        records = (
            SettlementRecord.objects.filter(contributions__node=node)
            .exclude(contributions_json="")
            .distinct()
            .order_by("-created_at")
        )
        batch = request.query_params.get("batch")
        if batch:
            records = records.filter(batch_id=batch)
        proofs = [
            contribution_proof(r, node.pk) | {"closed_reason": r.closed_reason} for r in records
        ]
        if batch and not proofs:
            raise NotFound(f"Batch {batch} covers no contribution of node {node.pk}.")
        return Response({"node": node.pk, "batches": proofs})
