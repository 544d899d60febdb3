FROM python:3.12-slim
WORKDIR /app
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
# the server never runs as root: a system user without a shell or a writable home
RUN useradd --system --uid 10001 --home-dir /nonexistent --no-create-home \
        --shell /usr/sbin/nologin im \
    && mkdir -p /data && chown im:im /data && chmod 0700 /data
COPY pyproject.toml README.md alembic.ini ./
COPY im_server ./im_server
COPY migrations ./migrations
RUN pip install --no-cache-dir -e .
# the embedded stores (used only when IM_DATABASE_URL / IM_REDIS_URL are unset) keep
# their data here; everything else in the image stays read-only to the server
ENV IM_DATA_DIR=/data
USER im:im
EXPOSE 8000
# migrate, then serve (the URLs come from the environment)
CMD ["sh", "-c", "im-server migrate && exec im-server serve --host 0.0.0.0 --port 8000"]
