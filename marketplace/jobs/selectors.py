"""Reads for jobs: what a buyer may see, and what a node has earned."""

from __future__ import annotations

from datetime import datetime, time
from decimal import Decimal

from django.db.models import Prefetch, QuerySet
from django.utils import timezone

from marketplace.accounts.models import User
from marketplace.jobs.models import Job, Round, TaskResult
from marketplace.nodes.models import Node


def jobs_of(user: User) -> QuerySet[Job]:
    """A buyer's own jobs (operators see all); anything else is a 404 to them."""
    qs = Job.objects.all() if user.is_operator else Job.objects.filter(buyer=user)
    return qs.prefetch_related(Prefetch("rounds", queryset=Round.objects.order_by("number")))


def rounds_of(job: Job) -> QuerySet[Round]:
    return Round.objects.filter(job=job).order_by("number")


def _charge(result: TaskResult) -> Decimal:
    price = result.task.price_per_gpu_hour or Decimal("0")
    return price * Decimal(str(result.compute_s)) / Decimal(3600)


def node_earnings(node: Node) -> dict[str, str]:
    """Credited results at the leased price x metered GPU time (what the ledger will pay)."""
    start_of_day = timezone.make_aware(datetime.combine(timezone.now().date(), time.min))
    total = today = Decimal("0")
    for result in TaskResult.objects.filter(node=node, credited=True).select_related("task"):
        charge = _charge(result)
        total += charge
        if result.created_at >= start_of_day:
            today += charge
    quantum = Decimal("0.000001")
    return {"today": str(today.quantize(quantum)), "total": str(total.quantize(quantum))}
