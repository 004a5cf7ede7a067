from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("api/v1/", include("marketplace.api.urls")),
    path("admin/", admin.site.urls),
    path("", include("marketplace.web.urls")),
]

handler404 = "marketplace.api.errors.not_found_view"
handler500 = "marketplace.api.errors.server_error_view"
