/* A tiny MCP server over stdio, for scripts/test-windows: the Windows program that
 * `idemgate mcp -- tiny-mcp-server.exe` starts under Wine. One write tool, `send`, whose every run
 * appends a line to C:\mcp-effect.txt (the side effect the test counts). Frames are read a line
 * at a time and answered by matching their method; stdout is in text mode, so each answer ends in
 * CRLF, as a Windows program's does. Not a general MCP server: just enough of the protocol
 * (initialize, tools/list, tools/call) for the proxy's stdio door. */
#include <stdio.h>
#include <string.h>

/* The text of the "id" member as it stands in the frame (a number or a string), or NULL. */
static const char *id_of(const char *frame, char *out, size_t cap) {
  const char *p = strstr(frame, "\"id\":");
  size_t n = 0;
  if (!p) return NULL;
  p += 5;
  while (*p == ' ') p++;
  if (*p == '"') {
    out[n++] = *p++;
    while (*p && *p != '"' && n + 2 < cap) out[n++] = *p++;
    out[n++] = '"';
  } else {
    while (*p && *p != ',' && *p != '}' && n + 1 < cap) out[n++] = *p++;
  }
  out[n] = 0;
  return out;
}

int main(void) {
  static char frame[1 << 20];
  char id[128];
  while (fgets(frame, sizeof frame, stdin)) {
    if (strstr(frame, "\"method\":\"notifications/")) continue;
    if (!id_of(frame, id, sizeof id)) continue;
    if (strstr(frame, "\"method\":\"initialize\"")) {
      printf("{\"jsonrpc\":\"2.0\",\"id\":%s,\"result\":{\"protocolVersion\":\"2025-06-18\","
             "\"capabilities\":{\"tools\":{}},\"serverInfo\":{\"name\":\"tiny\",\"version\":\"1\"}}}\n",
             id);
    } else if (strstr(frame, "\"method\":\"tools/list\"")) {
      printf("{\"jsonrpc\":\"2.0\",\"id\":%s,\"result\":{\"tools\":[{\"name\":\"send\","
             "\"description\":\"Sends a message.\",\"inputSchema\":{\"type\":\"object\","
             "\"properties\":{\"to\":{\"type\":\"string\"}}},\"annotations\":"
             "{\"readOnlyHint\":false,\"idempotentHint\":false}}]}}\n",
             id);
    } else if (strstr(frame, "\"method\":\"tools/call\"")) {
      FILE *effect = fopen("C:\\mcp-effect.txt", "a");
      if (effect) {
        fputs("sent\n", effect);
        fclose(effect);
      }
      printf("{\"jsonrpc\":\"2.0\",\"id\":%s,\"result\":{\"content\":[{\"type\":\"text\","
             "\"text\":\"sent\"}],\"isError\":false}}\n",
             id);
    } else {
      printf("{\"jsonrpc\":\"2.0\",\"id\":%s,\"error\":{\"code\":-32601,\"message\":\"no such method\"}}\n",
             id);
    }
    fflush(stdout);
  }
  return 0;
}
