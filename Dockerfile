FROM python:3.12-slim
WORKDIR /app
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
COPY pyproject.toml README.md alembic.ini ./
COPY im_server ./im_server
COPY migrations ./migrations
RUN pip install --no-cache-dir -e .
EXPOSE 8000
# migrate, then serve (the URLs come from the environment)
CMD ["sh", "-c", "im-server migrate && exec im-server serve --host 0.0.0.0 --port 8000"]
