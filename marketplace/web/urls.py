"""The server-rendered web marketplace: public market, buyer, provider and operator pages."""

from django.contrib.staticfiles.views import serve as serve_static
from django.urls import path, re_path

from marketplace.web.views import buyer, operator, provider, public, uploads

app_name = "web"

urlpatterns = [
    path("", public.market, name="market"),
    path("signup/", public.signup, name="signup"),
    path("login/", public.WebLoginView.as_view(), name="login"),
    path("logout/", public.WebLogoutView.as_view(), name="logout"),
    path("compare/", public.comparison, name="compare"),
    path("jobs/", buyer.job_list, name="jobs"),
    path("jobs/new/", buyer.job_new, name="job-new"),
    path("jobs/estimate/", buyer.job_estimate, name="job-estimate"),
    path("uploads/", uploads.upload_new, name="upload-new"),
    path("uploads/<uuid:pk>/", uploads.upload_chunk, name="upload"),
    path("uploads/<uuid:pk>/finish/", uploads.upload_finish, name="upload-finish"),
    path("jobs/<uuid:pk>/", buyer.job_detail, name="job"),
    path("jobs/<uuid:pk>/live/", buyer.job_live, name="job-live"),
    path("jobs/<uuid:pk>/events/", buyer.job_events, name="job-events"),
    path("jobs/<uuid:pk>/model/", buyer.job_model, name="job-model"),
    path("jobs/<uuid:pk>/predictions/", buyer.job_predictions, name="job-predictions"),
    path("jobs/<uuid:pk>/provenance/", buyer.job_provenance, name="job-provenance"),
    path("jobs/<uuid:pk>/<str:action>/", buyer.job_action, name="job-action"),
    path("nodes/", provider.node_list, name="nodes"),
    path("nodes/<int:pk>/price/", provider.node_price, name="node-price"),
    path("earnings/", provider.earnings, name="earnings"),
    path("earnings/live/", provider.earnings_live, name="earnings-live"),
    path("earnings/events/", provider.earnings_events, name="earnings-events"),
    path("keys/", provider.api_keys, name="keys"),
    path("operator/", operator.overview, name="operator"),
    path("operator/live/", operator.overview_live, name="operator-live"),
    path("operator/events/", operator.overview_events, name="operator-events"),
    # the web server serves no static files and the pages' few files are small: let Django serve
    # them (from the apps' static folders, no collectstatic) rather than need a web server.
    re_path(r"^static/(?P<path>.+)$", serve_static, {"insecure": True}),
]
