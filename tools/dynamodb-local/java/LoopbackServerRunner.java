// Starts DynamoDB Local like its own ServerRunner, but listening on 127.0.0.1 only and answering
// only requests addressed to it.
//
// DynamoDB Local has no option for the listen address: DynamoDBProxyServer builds a Jetty
// `new Server(port)`, whose connector binds every interface. This launcher builds the server
// through the public `ServerRunner.createServerFromCommandLineArgs`, sets the host of the
// (not yet started) Jetty connector, puts OwnHostOnly in front of DynamoDB Local's handler, then
// starts it. Telemetry is never configured, so none is sent. Compiled once at install time by the
// dynamodb-local crate (src/lib.rs), which needs `javac` for it.
import java.lang.reflect.Field;
import java.net.InetSocketAddress;
import java.net.SocketAddress;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.util.List;
import java.util.Locale;
import org.eclipse.jetty.http.HttpFields;
import org.eclipse.jetty.http.HttpHeader;
import org.eclipse.jetty.server.Connector;
import org.eclipse.jetty.server.Handler;
import org.eclipse.jetty.server.NetworkConnector;
import org.eclipse.jetty.server.Request;
import org.eclipse.jetty.server.Response;
import org.eclipse.jetty.server.Server;
import org.eclipse.jetty.server.ServerConnector;
import org.eclipse.jetty.util.Callback;
import software.amazon.dynamodb.services.local.main.ServerRunner;
import software.amazon.dynamodb.services.local.server.DynamoDBProxyServer;

public final class LoopbackServerRunner {
    public static void main(String[] args) throws Exception {
        String host = System.getProperty("dynamodb.local.host", "127.0.0.1");
        DynamoDBProxyServer proxy = ServerRunner.createServerFromCommandLineArgs(args);
        Field field = DynamoDBProxyServer.class.getDeclaredField("server");
        field.setAccessible(true);
        Server server = (Server) field.get(proxy);
        int connectors = 0;
        for (Connector connector : server.getConnectors()) {
            if (connector instanceof ServerConnector) {
                ((ServerConnector) connector).setHost(host);
                connectors++;
            }
        }
        if (connectors == 0) {
            System.err.println("LoopbackServerRunner: no Jetty ServerConnector to restrict to " + host);
            System.exit(2);
        }
        OwnHostOnly guard = new OwnHostOnly();
        guard.setHandler(server.getHandler());
        server.setHandler(guard);
        // Prints "Could not start server on port N: ..." and stops the server if the bind fails.
        proxy.start();
        if (!server.isStarted()) {
            System.exit(1);
        }
        for (Connector connector : server.getConnectors()) {
            if (connector instanceof NetworkConnector) {
                NetworkConnector network = (NetworkConnector) connector;
                System.out.println("DynamoDB Local listening on " + network.getHost() + ":" + network.getLocalPort());
            }
        }
    }
}

/**
 * Answers 403 to a request that is not addressed to this server or that a browser page sent.
 *
 * DynamoDB Local checks no signature: whoever reaches it reads and writes every table. Listening on
 * 127.0.0.1 keeps other machines out, but not a web page open in a browser on this machine: through
 * DNS rebinding (a name of the page's own that it makes resolve to 127.0.0.1) the page's requests are
 * same-origin to it, and it could Scan and UpdateItem at will. Such a request names the page's host
 * in `Host`, and a browser sends `Origin` with it; an SDK client sends `Host: 127.0.0.1:PORT` (or
 * `localhost:PORT`) and no `Origin`. DynamoDB Local serves no page, so no `Origin` is its own.
 */
final class OwnHostOnly extends Handler.Wrapper {
    @Override
    public boolean handle(Request request, Response response, Callback callback) throws Exception {
        String refusal = refusal(request);
        if (refusal == null) {
            return super.handle(request, response, callback);
        }
        response.setStatus(403);
        response.getHeaders().put(HttpHeader.CONTENT_TYPE, "text/plain; charset=utf-8");
        response.getHeaders().put(HttpHeader.CONNECTION, "close");
        byte[] body = (refusal + "\n").getBytes(StandardCharsets.UTF_8);
        response.write(true, ByteBuffer.wrap(body), callback);
        return true;
    }

    /** Why the request is refused, or null if it is addressed to this server by a client that is not a page. */
    private static String refusal(Request request) {
        int port = localPort(request);
        HttpFields headers = request.getHeaders();
        List<String> hosts = headers.getValuesList(HttpHeader.HOST);
        String host = hosts.size() == 1 ? hosts.get(0).trim().toLowerCase(Locale.ROOT) : null;
        if (host == null || !(host.equals("127.0.0.1:" + port) || host.equals("localhost:" + port))) {
            return "DynamoDB Local answers only requests addressed to it (Host: 127.0.0.1:" + port
                + " or localhost:" + port + "), not Host " + (hosts.isEmpty() ? "(none)" : String.join(", ", hosts));
        }
        String origin = headers.get(HttpHeader.ORIGIN);
        if (origin != null) {
            return "DynamoDB Local answers no browser page (Origin " + origin + "): use an SDK client";
        }
        return null;
    }

    private static int localPort(Request request) {
        SocketAddress local = request.getConnectionMetaData().getLocalSocketAddress();
        return local instanceof InetSocketAddress ? ((InetSocketAddress) local).getPort() : -1;
    }
}
