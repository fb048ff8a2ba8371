from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path
from django.views.generic import RedirectView

from geosense.accounts.login import login_view
from geosense.health import healthz

urlpatterns = [
    # The API first, a turn's stream first of it: most requests are a turn's, and Django tries
    # each pattern in order, an include that does not match raising and catching a Resolver404.
    path("api/", include("chat.api_urls")),
    path("api/", include("geosense.accounts.urls")),
    path("api/", include("geosense.annotations.urls")),
    path("tiles/", include("geosense.annotations.tile_urls")),
    path("", RedirectView.as_view(url="/chat/", permanent=False)),
    path("healthz", healthz, name="healthz"),
    path("accounts/login/", login_view, name="login"),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    # The admin's login is the throttled one (geosense/accounts/login.py).
    path("admin/login/", login_view),
    path("admin/", admin.site.urls),
    path("", include("chat.page_urls")),
]
