"""Buyers: submit a job (with a live estimate), list jobs, watch one, control it, download it."""

from __future__ import annotations

import math
from decimal import Decimal, InvalidOperation

from django.conf import settings
from django.contrib import messages
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST

from marketplace.api.throttles import SubmitThrottle
from marketplace.events import topics
from marketplace.events.stream import event_stream
from marketplace.jobs import files
from marketplace.jobs.errors import Conflict, InvalidSpec, MarketplaceError
from marketplace.jobs.market import market_price
from marketplace.jobs.models import Job
from marketplace.jobs.selectors import jobs_of, scoring_result
from marketplace.jobs.services import cancel_job, pause_job, resume_job
from marketplace.jobs.submission import parse_job_spec, submit_job
from marketplace.ledger.metering import Rules, speed_factor
from marketplace.ledger.selectors import balances
from marketplace.nodes.selectors import benchmark_of, online_nodes, speed_of
from marketplace.numbers import is_ascii_text
from marketplace.sweeps.selectors import best_trial, trial_rows
from marketplace.web import estimate, jobview
from marketplace.web.access import buyer_required
from marketplace.web.forms import JobForm
from marketplace.web.views.common import not_found, problem_lines, wants_json
from trainer.spec import JobSpec

ACTIONS = {"pause": pause_job, "resume": resume_job, "cancel": cancel_job}


def _job(request: HttpRequest, pk: str) -> Job | None:
    """The user's own job (any job for operators), or None: never someone else's."""
    return jobs_of(request.user).filter(pk=pk).first()


@buyer_required
def job_list(request: HttpRequest) -> HttpResponse:
    jobs = list(jobs_of(request.user).order_by("-created_at")[:200])
    for job in jobs:
        done = [r for r in job.rounds.all() if r.metrics]
        job.accuracy = done[-1].metrics.get("accuracy") if done else None
    context = {"jobs": jobs, "balances": balances(request.user)}
    return render(request, "web/jobs.html", context)


def _market_estimate(spec: JobSpec, tier: str, max_price: Decimal) -> dict | None:
    arch = spec.model.arch
    rules = Rules.from_settings()
    offers = [
        estimate.Offer(
            n.price_per_gpu_hour,
            estimate.samples_per_s(benchmark_of(n), arch),
            speed_factor(speed_of(n), rules),
        )
        for n in online_nodes().filter(price_per_gpu_hour__lte=max_price)
    ]
    work = estimate.work_of(spec, estimate.train_samples(spec), settings.GPUFLEX["DEFAULT_SHARDS"])
    result = estimate.estimate(
        work, offers, max_price=max_price, tier=tier, bonus_max=rules.bonus_max
    )
    return result.as_dict() if result else None


def _decimal(value: str | None, default: str) -> Decimal:
    if not is_ascii_text(value):  # Decimal() reads Arabic-Indic and full-width digits too
        return Decimal(default)
    try:
        return Decimal(value or default)
    except InvalidOperation:
        return Decimal(default)


@buyer_required
@require_POST
def job_estimate(request: HttpRequest) -> JsonResponse:
    """The submit page posts the editor's text here as the buyer types: inline problems and,
    once the spec is valid, the estimate from the nodes online now."""
    text = request.POST.get("spec", "")
    try:
        spec = parse_job_spec(text, federated=bool(request.POST.get("federated_dataset")))
    except InvalidSpec as exc:
        problems = problem_lines(text, exc.extra.get("problems", []))
        return JsonResponse({"ok": False, "problems": problems})
    max_price = _decimal(request.POST.get("max_price_per_gpu_hour"), "1")
    tier = request.POST.get("tier", "hybrid")
    return JsonResponse(
        {
            "ok": True,
            "problems": [],
            "dataset": spec.dataset.kind,
            "needs_upload": spec.dataset.kind not in estimate.BUILTIN_SIZES,
            "estimate": _market_estimate(spec, tier, max_price),
        }
    )


def _submit(request: HttpRequest, form: JobForm) -> tuple[Job | None, list[dict], str]:
    """(job, spec problems, error sentence): exactly one of job / an error is set."""
    data = form.cleaned_data
    try:
        job = submit_job(
            buyer=request.user,
            spec_data=data["spec"],
            dataset_upload=data.get("dataset"),
            dataset_upload_id=data.get("dataset_upload"),
            tier=data["tier"],
            budget=data["budget"],
            max_price_per_gpu_hour=data["max_price_per_gpu_hour"],
            federated_dataset=data.get("federated_dataset", ""),
        )
    except InvalidSpec as exc:
        return None, problem_lines(data["spec"], exc.extra.get("problems", [])), exc.detail
    except MarketplaceError as exc:  # the ledger's too, e.g. not enough credit for the budget
        return None, [], exc.detail
    return job, [], ""


@buyer_required
def job_new(request: HttpRequest) -> HttpResponse:
    form = JobForm(
        request.POST or None, request.FILES or None,
        market_price=market_price(), online=online_nodes().exists(),
    )  # fmt: skip
    problems: list[dict] = []
    error = ""
    status, retry_after = 400, None
    if request.method == "POST":
        # the API's submission rate, counted for the buyer across the API and this page
        throttle = SubmitThrottle()
        if not throttle.allow_request(request, None):
            retry_after = max(1, math.ceil(throttle.wait() or 1))
            status, error = 429, f"Too many submissions: try again in {retry_after} s."
        elif form.is_valid():
            job, problems, error = _submit(request, form)
            if job is not None:
                url = reverse("web:job", args=[job.pk])
                if wants_json(request):
                    return JsonResponse({"ok": True, "redirect": url}, status=201)
                return redirect(url)
        else:
            error = "Please correct the fields marked below."
        if wants_json(request):
            fields = {k: [str(e) for e in v] for k, v in form.errors.items()}
            body = {"ok": False, "error": error, "problems": problems, "fields": fields}
            response = JsonResponse(body, status=status)
            if retry_after is not None:
                response["Retry-After"] = str(retry_after)
            return response
    context = {
        "form": form,
        "problems": problems,
        "error": error,
        "balances": balances(request.user),
        "max_upload_mb": settings.GPUFLEX["MAX_DATASET_BYTES"] / 2**20,
        "max_chunked_gb": settings.GPUFLEX["MAX_UPLOAD_BYTES"] / 2**30,
        # above this a file goes in resumable chunks (static/web/js/upload.js)
        "chunked_above": min(settings.GPUFLEX["MAX_DATASET_BYTES"], 16 * 2**20),
    }
    response = render(request, "web/job_new.html", context, status=status if error else 200)
    if retry_after is not None:
        response["Retry-After"] = str(retry_after)
    return response


@buyer_required
@require_GET
def job_detail(request: HttpRequest, pk: str) -> HttpResponse:
    from marketplace.jobs.export import formats_for

    job = _job(request, pk)
    if job is None:
        return not_found(request, "job")
    live = jobview.live_payload(job)
    context = {
        "job": job,
        "live": live,
        "provenance": live["provenance"],
        "spec_json": jobview.spec_yaml(job),
        "model_formats": formats_for(job),
        "scoring": scoring_result(job),
        "trials": trial_rows(job) if job.kind == "sweep" else [],
        "best_trial": best_trial(job) if job.kind == "sweep" else None,
    }
    return render(request, "web/job.html", context)


@buyer_required
@require_GET
def job_live(request: HttpRequest, pk: str) -> JsonResponse:
    """Polled every second by the job page: charts and tables grow without a reload."""
    job = _job(request, pk)
    if job is None:
        return JsonResponse({"detail": "Not found."}, status=404)
    return JsonResponse(jobview.live_payload(job))


@buyer_required
@require_GET
def job_events(request: HttpRequest, pk: str) -> HttpResponse:
    """The job page's live data, pushed (Server-Sent Events) each time it changes; the page
    falls back to polling `job_live` where it cannot hold a stream."""
    job = _job(request, pk)
    if job is None:
        return JsonResponse({"detail": "Not found."}, status=404)

    def render() -> dict:
        return jobview.live_payload(Job.objects.get(pk=job.pk))

    return event_stream([topics.job(job.pk)], render, done=lambda d: not jobview.is_live(d))


@buyer_required
@require_POST
def job_action(request: HttpRequest, pk: str, action: str) -> HttpResponse:
    job = _job(request, pk)
    if job is None or action not in ACTIONS:
        return not_found(request, "job")
    try:
        ACTIONS[action](job)
        messages.success(request, f"Job {action}d." if action != "cancel" else "Job cancelled.")
    except Conflict as exc:
        messages.error(request, exc.detail)
    return redirect("web:job", pk=job.pk)


@buyer_required
@require_GET
def job_model(request: HttpRequest, pk: str) -> HttpResponse:
    """The latest global model in a format (?format=), as the API's /jobs/{id}/model gives it."""
    from marketplace.jobs.export import Pending, job_model_download

    job = _job(request, pk)
    if job is None:
        return not_found(request, "job")
    try:
        download = job_model_download(job, request.GET.get("format", "safetensors"))
    except MarketplaceError as exc:
        messages.error(request, exc.detail)
        return redirect("web:job", pk=job.pk)
    if isinstance(download, Pending):  # a worker is making it (onnx, torchscript, hf)
        messages.info(request, f"{download.detail} The link downloads it once it is made.")
        return redirect("web:job", pk=job.pk)
    response = HttpResponse(download.data, content_type=download.content_type)
    response["Content-Disposition"] = f'attachment; filename="{download.filename}"'
    response["X-GPUFlex-Model-Hash"] = job.model_hash
    return response


@buyer_required
@require_GET
def job_predictions(request: HttpRequest, pk: str) -> HttpResponse:
    """A finished inference job's predictions (Parquet), as the API's /jobs/{id}/predictions."""
    from marketplace.rounds.scoring import predictions_file

    job = _job(request, pk)
    if job is None:
        return not_found(request, "job")
    try:
        data = predictions_file(job)
    except MarketplaceError as exc:
        messages.error(request, exc.detail)
        return redirect("web:job", pk=job.pk)
    response = HttpResponse(data, content_type="application/vnd.apache.parquet")
    response["Content-Disposition"] = f'attachment; filename="predictions-{job.pk}.parquet"'
    return response


@buyer_required
@require_GET
def job_provenance(request: HttpRequest, pk: str) -> HttpResponse:
    job = _job(request, pk)
    if job is None or not job.rounds_done:
        return not_found(request, "provenance record")
    record = files.get(files.provenance_name(job.pk))
    response = HttpResponse(record, content_type="application/json")
    response["Content-Disposition"] = f'attachment; filename="{job.pk}-provenance.json"'
    return response
